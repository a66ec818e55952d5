"""End-to-end privacy audit of the real client updates.

Every method's real upload is audited on a tiny model and must stay at or below its claim;
broken variants of the real code — a label mechanism whose candidate set always holds the
click (the published DPL), noise 10x smaller than calibrated, a reply that carries the raw
loss — must be caught (lower bound above the claim), so the audit can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import privaterec.fed.methods.privaterec as fed_client
from privaterec.cli import main
from privaterec.fed.update import ClientUpdate
from privaterec.privacy.audit import epsilon_from_rates
from privaterec.audit import broken
from privaterec.audit import (AuditWorld, PairAudit, audit_pair, bound_ceiling,
                                          claimed_budget, distinguish, make_target,
                                          make_world, neighbour_pairs)
from privaterec.audit.targets import CENTERED_MODEL
from privaterec.privacy.events import PrivacyEvent

RUNS = 160  # per neighbour: 80 test runs, bound ceiling ln(80/3.7) = 3.05


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def world() -> AuditWorld:
    return make_world()


def pair(world: AuditWorld, adjacency: str, name: str):
    return next(p for p in neighbour_pairs(world, adjacency) if p.name == name)


def audit(world: AuditWorld, method: str, adjacency: str, name: str, *, mode: str = "strict",
          epsilon: float = 1.0, runs: int = RUNS, model=None) -> PairAudit:
    target = make_target(method, world, mode=mode, epsilon=epsilon, model=model)
    return audit_pair(target.upload, pair(world, adjacency, name), method=method, mode=mode,
                      runs=runs, seed=1)


# --------------------------------------------------------------------------- distinguisher
def laplace_runs(shift: float, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).laplace(shift, 1.0, size=(n, 3))


def test_distinguisher_bound_holds_at_its_confidence_and_comes_near_a_known_epsilon():
    # Laplace(b = 1) shifted by ε in one of 3 coordinates: exactly ε-DP, and tight (the
    # likelihood ratio is e^ε on a whole tail), so the 95% bound exceeds ε in about 5% of
    # repetitions and no more.
    epsilon, n, repetitions = 2.0, 1000, 40
    bounds = []
    for r in range(repetitions):
        parts = [(laplace_runs(0, n, 6 * r + 2 * i),
                  laplace_runs(0, n, 6 * r + 2 * i + 1) + np.array([epsilon, 0, 0]))
                 for i in range(3)]
        bounds.append(distinguish(*parts, ["payload[0]", "payload[1]", "payload[2]"])
                      .epsilon_lower_bound)
    bounds = np.array(bounds)
    assert (bounds > epsilon).sum() <= 6  # P(Binomial(40, 0.05) > 6) = 1.3%
    assert np.median(bounds) > 0.6 * epsilon


def test_distinguisher_finds_nothing_between_identical_distributions():
    parts = [(laplace_runs(0, 400, 2 * i), laplace_runs(0, 400, 2 * i + 1)) for i in range(3)]
    assert distinguish(*parts, ["a", "b", "c"]).epsilon_lower_bound < 0.3


def test_bound_ceiling_is_the_bound_of_a_perfect_test():
    assert bound_ceiling(500) == pytest.approx(math.log((1 - (1 - 0.025 ** (1 / 500)))
                                                        / (1 - 0.025 ** (1 / 500))))
    assert bound_ceiling(500) == pytest.approx(
        epsilon_from_rates(1 - 0.025 ** (1 / 500), 1 - 0.025 ** (1 / 500)))


def test_claim_uses_the_user_level_epsilon_under_user_adjacency():
    event = PrivacyEvent(mechanism="randomized_response", epsilon=1.0, epsilon_user=4.0,
                         phase="train")
    assert claimed_budget([event], "click").epsilon == 1.0
    assert claimed_budget([event], "user").epsilon == 4.0


# ------------------------------------------------------------------ the real client updates
@pytest.mark.parametrize("method,adjacency,name", [
    ("dp-fedrec", "user", "one-impression"),
    ("fednewsrec", "user", "one-impression"),
    ("unifedrec", "user", "one-impression"),
    ("privaterec", "click", "history"),
    ("privaterec", "click", "label"),
    ("dp-fedavg", "user", "one-impression"),
    ("dp-fedavg-adaptive", "user", "one-impression"),
    ("dp-fedavg-news", "user", "one-impression"),
    ("dp-fedavg-news", "click", "history"),
])
def test_real_client_update_stays_below_its_claim(world, method, adjacency, name):
    result = audit(world, method, adjacency, name)
    assert result.claim_valid and math.isfinite(result.claimed_epsilon)
    assert not result.violated, result.to_dict()


def test_fedrec_upload_is_told_apart_perfectly_and_claims_nothing(world):
    result = audit(world, "fedrec", "click", "history")
    assert math.isinf(result.claimed_epsilon) and not result.violated
    assert result.epsilon_lower_bound == pytest.approx(result.result.ceiling)


# PrivateRec's published dot-product attention at d = 1 (TINY_MODEL) and the default
# centered attention at d = 2 (CENTERED_MODEL; at d = 1 a cosine is a sign, see targets.py).
PRIVATEREC_MODELS = {"dot": None, "centered": CENTERED_MODEL}


@pytest.mark.parametrize("attention", list(PRIVATEREC_MODELS))
def test_privaterec_paper_mode_leaks_the_history_and_says_its_claim_is_invalid(world,
                                                                               attention):
    result = audit(world, "privaterec", "click", "history", mode="paper",
                   model=PRIVATEREC_MODELS[attention])
    assert not result.claim_valid and not result.violated
    assert result.epsilon_lower_bound > result.claimed_epsilon  # the raw gradient leaks


@pytest.mark.parametrize("name", ["history", "label"])
def test_privaterec_strict_mode_with_centered_attention_stays_below_its_claim(world, name):
    result = audit(world, "privaterec", "click", name, model=CENTERED_MODEL)
    assert result.claim_valid and math.isfinite(result.claimed_epsilon)
    assert not result.violated, result.to_dict()


# ------------------------------------------------------------------------- broken variants
def test_a_label_release_whose_candidates_always_hold_the_click_is_caught(world):
    with broken.published_dpl():
        result = audit(world, "privaterec", "click", "label", runs=400)
    assert result.violated, result.to_dict()
    assert result.epsilon_lower_bound > 2 * result.claimed_epsilon


@pytest.mark.parametrize("method", ["dp-fedrec", "unifedrec"])
def test_noise_ten_times_smaller_than_calibrated_is_caught(world, method):
    with broken.scaled_noise(0.1):
        result = audit(world, method, "user", "one-impression")
    assert result.claimed_epsilon == 1.0
    assert result.violated, result.to_dict()


def test_central_noise_a_hundred_times_smaller_than_calibrated_is_caught(world):
    """The aggregator's noise on the sum and on the clip count at 1% of its scale."""
    with broken.scaled_gaussian_noise(0.01):
        result = audit(world, "dp-fedavg-adaptive", "user", "one-impression")
    assert result.claimed_epsilon == pytest.approx(1.0, abs=2e-3)
    assert result.violated, result.to_dict()


def test_news_space_noise_a_hundred_times_smaller_than_calibrated_is_caught(world):
    with broken.scaled_gaussian_noise(0.01):
        result = audit(world, "dp-fedavg-news", "user", "one-impression")
    assert result.claimed_epsilon == pytest.approx(1.0, abs=2e-3)
    assert result.violated, result.to_dict()


def test_news_space_noise_on_the_touched_news_only_is_caught(world):
    """Clipped in news-vector space, the noise must cover every news of the table: noised
    only where the round's clients touched a news, the zero rows name the history."""
    with broken.noise_on_touched_news_only():
        result = audit(world, "dp-fedavg-news", "click", "history")
    assert result.violated, result.to_dict()


def test_a_clip_count_released_without_its_noise_is_caught(world):
    """Adaptive clipping: the two one-impression users' updates lie on either side of the
    clip (norms 0.130 and 0.085 against 0.1 at theta_0), so their clip indicators differ;
    released without noise, the count alone tells them apart."""
    with broken.unnoised_clip_count():
        result = audit(world, "dp-fedavg-adaptive", "user", "one-impression")
    assert result.violated and result.result.statistic == "clip_count", result.to_dict()


def test_a_reply_carrying_the_raw_loss_is_caught(world):
    with broken.reply_with_loss():
        result = audit(world, "dp-fedrec", "user", "one-impression")
    assert result.violated and result.result.statistic == "loss", result.to_dict()


def test_the_broken_variants_are_undone_on_exit():
    import privaterec.fed.methods.dp_fedavg as central
    from privaterec.fed.secagg import SecAggRound
    from privaterec.privacy.samplers import SecureNoise, SimulationNoise

    def patched():
        return (fed_client.release_labels, SimulationNoise.draw, ClientUpdate.sent,
                central.CentralDP.noised_sums, central.CentralDP.news_space_release,
                SecureNoise.release, SecAggRound.__dict__["share_sigma"])

    before = patched()
    with broken.published_dpl(), broken.scaled_noise(0.1), broken.reply_with_loss(), \
            broken.scaled_gaussian_noise(0.1), broken.unnoised_clip_count(), \
            broken.noise_on_touched_news_only(), broken.scaled_secure_noise(0.5), \
            broken.scaled_noise_shares(0.5):
        assert fed_client.release_labels is broken.published_dpl_labels
        assert SimulationNoise.draw is not before[1]
        assert SecureNoise.release is not before[5]
        assert SecAggRound.__dict__["share_sigma"] is not before[6]
    assert patched() == before


# ------------------------------------------------------------------------------------ CLI
def test_cli_prints_the_table_and_exits_zero_when_claims_hold(capsys):
    code = main(["privacy", "audit", "--method", "dp-fedrec", "--adjacency", "user",
                 "--epsilon", "1", "--runs", "32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| dp-fedrec | - | user: one-impression | 1 |" in out
    assert "no lower bound above its claim" in out


def test_cli_exits_one_when_a_bound_exceeds_its_claim(capsys):
    with broken.reply_with_loss():
        code = main(["privacy", "audit", "--method", "dp-fedrec", "--adjacency", "user",
                     "--epsilon", "1", "--runs", "64", "--json"])
    assert code == 1
    assert '"violated": true' in capsys.readouterr().out


def test_cli_audits_every_declared_federated_method():
    # the audited clients derive from the methods' one declaration (method_settings.SETTINGS)
    import argparse

    from privaterec.audit import ADJACENCIES, METHODS, MODES
    from privaterec.audit.canary import VIEWS
    from privaterec.cli import build_parser
    from privaterec.method_settings import PRIVACY_MODES, SETTINGS

    def sub(parser, name):
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return action.choices[name]

    audit = sub(sub(build_parser(), "privacy"), "audit")
    choices = {flag: tuple(a.choices) for a in audit._actions if a.choices
               for flag in a.option_strings}
    assert choices["--method"] == METHODS and choices["--mode"] == MODES == PRIVACY_MODES
    assert set(METHODS) == {*SETTINGS, "dp-fedavg-adaptive", "dp-fedavg-news"}
    assert choices["--adjacency"] == ADJACENCIES == ("click", "user")
    assert choices["--canary-view"] == (*VIEWS, "client-app")
