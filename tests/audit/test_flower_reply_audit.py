"""Worst-case canary audits of what the Flower ClientApp really returns.

The reply comes out of the ClientApp's own ``train`` handler (``client_train``), fed a
message as the ServerApp builds it, many rounds of the canary user per message
(privaterec.audit.flower_reply): a correct reply passes, a noise cut by 2x and a private
reply that also carries the loss are caught.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower ClientApp needs flwr")

from privaterec.audit import broken  # noqa: E402
from privaterec.audit.canary import play  # noqa: E402
from privaterec.audit.flower_reply import (client_app_replies, flower_canary_games,  # noqa: E402
                                           flower_game, play_flower)
from privaterec.audit.world import make_world  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# Replies per side (half test): the Laplace worst case at claimed epsilon 1 with its noise
# cut 2x (true epsilon 2) expects a bound of about 1.3 at 160 test runs, the correct one 0.6.
RUNS = 320


@pytest.fixture(scope="module")
def world():
    return make_world()


@pytest.fixture(scope="module")
def laplace_game(world):
    return flower_game("dp-fedrec", world, epsilon=1.0)


def test_the_client_app_replies_the_clipped_canary_plus_its_noise(laplace_game):
    replies = client_app_replies(laplace_game.d1, runs=120, round_index=0)
    assert replies.payloads.shape == (120, 45)
    # +theta e_0 plus Laplace(2 theta / epsilon) on every coordinate, independent per user
    assert replies.payloads[:, 0].mean() == pytest.approx(0.005, abs=0.003)
    assert np.median(np.abs(replies.payloads[:, 1:])) == pytest.approx(0.01 * math.log(2),
                                                                       rel=0.15)
    assert len({tuple(r) for r in replies.payloads.round(9)}) == 120
    again = client_app_replies(laplace_game.d1, runs=3, round_index=0)
    assert np.array_equal(again.payloads, replies.payloads[:3])  # simulated partition: seeded
    assert set(replies.other) == {replies.other[0]}  # only the events: the same for all
    (other,) = {json.dumps(sorted(json.loads(o))) for o in replies.other}
    assert other == '["result.events"]' and 'laplace' in replies.other[0]


def test_a_correct_client_app_reply_passes_and_its_noise_cut_by_two_is_caught(laplace_game):
    correct = play_flower(laplace_game, runs=RUNS)
    assert correct.claimed_epsilon == 1.0
    assert not correct.violated, correct.to_dict()
    with broken.scaled_noise(0.5):
        cut = play_flower(laplace_game, runs=RUNS)
    assert cut.violated, cut.to_dict()


def test_a_private_reply_that_carries_the_loss_is_caught(laplace_game):
    with broken.private_reply_with_metadata():
        result = play_flower(laplace_game, runs=32)
    assert result.violated and math.isinf(result.epsilon_lower_bound)
    assert "non-payload field" in result.result.statistic


def test_dp_fedavg_client_app_reply_is_exactly_c_u_and_its_central_noise_cut_is_caught(world):
    games = flower_canary_games(world, epsilon=1.0, runs=32, adjacencies=["replace"])
    (game,) = games
    assert float(torch.linalg.vector_norm(game.d1.total.double())) == pytest.approx(0.1)
    assert torch.equal(game.d0.total, -game.d1.total)
    assert "(ClientApp reply)" in game.pair
    assert not play(game, runs=100_000, seed=3).violated
    with broken.scaled_gaussian_noise(0.5):
        cut = play(game, runs=100_000, seed=3)
    assert cut.violated, cut.to_dict()


@pytest.mark.slow
def test_the_deployed_client_app_reply_from_secure_noise(laplace_game):
    """A node with the OS CSPRNG (node option os-entropy, a deployed server's message
    without a seed): the reply is drawn by SecureNoise (float-safe discrete Laplace), not
    reproducible; a correct reply passes (checked at 99.9% confidence: the Laplace worst case
    is tight and the run is not seeded) and its noise cut 4x is caught."""
    first = client_app_replies(laplace_game.d1, runs=8, round_index=0, secure=True)
    second = client_app_replies(laplace_game.d1, runs=8, round_index=0, secure=True)
    assert not np.array_equal(first.payloads, second.payloads)
    assert not play_flower(laplace_game, runs=200, secure=True, alpha=1e-3).violated
    with broken.scaled_secure_noise(0.25, mechanism="laplace"):
        cut = play_flower(laplace_game, runs=200, secure=True)
    assert cut.violated, cut.to_dict()


def test_cli_audits_the_client_app_reply(capsys):
    from privaterec.cli import main

    code = main(["privacy", "audit", "--method", "dp-fedrec", "dp-fedavg", "--adjacency",
                 "user", "--epsilon", "1", "--runs", "16", "--canary-runs", "32",
                 "--canary-view", "client-app"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| dp-fedrec | replace: canary +C u vs -C u (ClientApp reply) | 1 |" in out
    assert "| dp-fedavg | add-remove: canary +C u vs no client (ClientApp reply) | 0.468 |" in out
