"""Federated evaluation inside a federated run: who is asked, what each device computes, and
how the server turns the releases into metrics (docs/privacy.md#federated-evaluation).

After every ``eval_every`` rounds and after the last round,
:func:`~privaterec.fed.simulator.train_federated` asks a sample of the roster (each enrolled
device independently with probability ``eval_fraction``, whatever its data: from the OS
CSPRNG on a deployed server, seeded by (seed, round) in a simulation) for its release
(:mod:`privaterec.eval.federated`), records one event per asked user in the ledger, and logs
the estimate. The releases come from an :data:`EvaluateFn`: :func:`local_evaluate_fn`
computes them in process from the devices' test impressions (the simulator), the Flower
ServerApp asks the SuperNodes (:mod:`privaterec.fed.flower.server_app`), which compute them
with :func:`device_release`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from privaterec.config import FedConfig
from privaterec.data.features import NewsFeatures
from privaterec.data.records import MindSplit
from privaterec.eval.evaluate import score_impressions
from privaterec.eval.federated import (DIMENSION, EvaluationPolicy, ImpressionPair,
                                       device_vector, pairs_by_user, release)
from privaterec.fed.rng import evaluation_client_noise, evaluation_noise
from privaterec.errors import ConfigError
from privaterec.fed.task import FederatedTask
from privaterec.models.recommender import Recommender
from privaterec.privacy.samplers import NoiseSource

EvaluateFn = Callable[[torch.Tensor, list[int], int], torch.Tensor]
"""``evaluate_fn(params [D], asked user indices (sorted), round_index)`` → the asked users'
releases ``float64[len(asked), 5]``, in the order of ``asked``."""


def evaluation_policy(fed: FedConfig) -> EvaluationPolicy | None:
    """The run's federated evaluation policy (``None``: the server evaluates itself)."""
    if fed.evaluation != "federated":
        return None
    return EvaluationPolicy(epsilon=fed.eval_epsilon, delta=fed.eval_delta, clip=fed.eval_clip,
                            fraction=fed.eval_fraction)


def evaluation_sample(num_users: int, fraction: float, *, seed: int, round_index: int,
                      source: NoiseSource | None = None) -> list[int]:
    """Each of the roster's ``num_users`` enrolled users independently with probability
    ``fraction`` (all of them at 1), sorted: seeded by (seed, round) in a simulation, from
    ``source`` (the OS CSPRNG) on a deployed server."""
    if fraction >= 1.0:
        return list(range(num_users))
    noise = evaluation_noise(seed, round_index) if source is None else source
    u = noise.uniform([num_users])
    return [int(i) for i in torch.nonzero(u < fraction).flatten()]


@dataclass(frozen=True)
class TestImpressions:  # noqa: D101 - (pytest: not a test class)
    """The devices' test impressions as a simulation holds them (one process, every user).

    Attributes
    ----------
    split: the test split (each impression belongs to the device of its ``user_id``).
    features: the news table covering it. history_len: H. batch_size: scoring batch.
    """

    split: MindSplit
    features: NewsFeatures
    history_len: int
    batch_size: int = 256

    __test__ = False  # not a pytest test class


def score_users(model: Recommender, data: TestImpressions, users: Sequence[str]
                ) -> Mapping[str, list[ImpressionPair]]:
    """The scored labelled impressions ``(labels, scores)`` of each of ``users`` in
    ``data`` (users without one are absent); the model as it is (θ loaded)."""
    wanted = set(users)
    own = [imp for imp in data.split.behaviors
           if imp.user_id in wanted and imp.labels is not None]
    if not own:
        return {}
    split = MindSplit(news=data.split.news, behaviors=own, path=data.split.path)
    scored = score_impressions(model, split, data.features, history_len=data.history_len,
                               batch_size=data.batch_size)
    return pairs_by_user([imp.user_id for imp in own], scored.pairs)


def device_release(pairs: Sequence[ImpressionPair], policy: EvaluationPolicy,
                   source: NoiseSource) -> torch.Tensor:
    """What one device sends: its clipped metric vector plus noise, ``float64[5]`` (a device
    without an evaluable impression sends noise around the zero vector)."""
    return release(device_vector(pairs, clip=policy.clip), policy, source)


def local_evaluate_fn(task: FederatedTask[Any], user_ids: Sequence[str],
                      data: TestImpressions, policy: EvaluationPolicy, *,
                      seed: int) -> EvaluateFn:
    """The simulator's :data:`EvaluateFn`: every asked device's release computed in process,
    each with its own seeded noise (:func:`~privaterec.fed.rng.evaluation_client_noise`;
    a simulation, never a deployed release)."""
    model = task.model
    if not isinstance(model, Recommender):
        raise ConfigError("federated evaluation ranks news: it needs a ranking run's model")

    def evaluate(params: torch.Tensor, asked: list[int], round_index: int) -> torch.Tensor:
        task.load(params)
        ids = [user_ids[u] for u in asked]
        scored = score_users(model, data, ids)
        rows = [device_release(scored.get(uid, []), policy,
                               evaluation_client_noise(seed, round_index, u))
                for u, uid in zip(asked, ids)]
        return (torch.stack(rows) if rows
                else torch.zeros(0, DIMENSION, dtype=torch.float64))

    return evaluate


@dataclass(frozen=True)
class FederatedEvaluation:
    """What an engine needs to evaluate federatedly: the policy, and in a simulation the
    devices' test impressions (``None`` on Flower: the devices hold them)."""

    policy: EvaluationPolicy
    local: TestImpressions | None = None


__all__ = ["EvaluateFn", "FederatedEvaluation", "TestImpressions", "device_release",
           "evaluation_policy", "evaluation_sample", "local_evaluate_fn", "score_users"]
