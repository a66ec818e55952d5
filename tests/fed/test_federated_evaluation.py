"""Federated evaluation (docs/privacy.md#federated-evaluation): devices release clipped,
noised metric sums; the server's estimate must agree with a server-side evaluation of the
same test impressions within the accounted noise, and the check must catch a release
without noise and users counted twice."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
import torch

from privaterec.config import ConfigError, FedConfig
from privaterec.eval.evaluate import score_impressions
from privaterec.eval.federated import (DIMENSION, METRICS, EvaluationPolicy, device_vector,
                                       evaluable)
from privaterec.eval.metrics import evaluate_impressions
from privaterec.fed import evaluation as fed_evaluation
from privaterec.fed import simulator
from privaterec.fed.evaluation import (FederatedEvaluation, TestImpressions,
                                       evaluation_policy, local_evaluate_fn)
from privaterec.fed.objective import LocalObjective
from privaterec.fed.simulator import FederatedState, train_federated
from privaterec.fed.strategies import build_strategy
from privaterec.privacy.ledger import PrivacyLedger

RUNS = 40  # independent evaluations per check: the z-scores' variance to within about ±0.5


def _pairs(rng: np.random.Generator, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for _ in range(n):
        labels = np.array([1, 0, 0, 1, 0])
        out.append((labels, rng.normal(size=5)))
    return out


def test_device_vector_is_clipped_to_k_per_coordinate() -> None:
    """Every coordinate is in [0, K] (L2 sensitivity K·√5); K = 1 gives the user's mean
    metrics and a count of 1; single-class impressions are left out; no evaluable
    impression gives the zero vector."""
    rng = np.random.default_rng(0)
    pairs = _pairs(rng, 7)
    mean = evaluate_impressions(pairs)
    one = device_vector(pairs, clip=1.0)
    assert one.tolist() == pytest.approx([mean[m] for m in METRICS] + [1.0])
    big = device_vector(pairs, clip=100.0)
    assert big.tolist() == pytest.approx([7 * mean[m] for m in METRICS] + [7.0])
    three = device_vector(pairs, clip=3.0)
    assert float(three.max()) <= 3.0 and float(three[-1]) == pytest.approx(3.0)
    single = [(np.array([0, 0, 0]), np.array([0.1, 0.2, 0.3])),
              (np.array([1, 1]), np.array([0.1, 0.2]))]
    assert not any(evaluable(y) for y, _ in single)
    assert device_vector(single, clip=1.0).tolist() == [0.0] * DIMENSION
    assert device_vector([], clip=2.0).shape == (DIMENSION,)
    policy = EvaluationPolicy(epsilon=1.0, delta=1e-6, clip=2.0)
    assert policy.sensitivity == pytest.approx(2.0 * math.sqrt(5))
    assert policy.event.sensitivity == pytest.approx(policy.sensitivity)
    assert policy.event.at_adjacency("user").epsilon == 1.0  # user-level as stated


def test_policy_from_config_and_its_validation() -> None:
    assert evaluation_policy(FedConfig()) is None
    policy = evaluation_policy(FedConfig(evaluation="federated", eval_epsilon=2.0,
                                         eval_clip=3.0, eval_fraction=0.5))
    assert policy == EvaluationPolicy(epsilon=2.0, delta=1e-6, clip=3.0, fraction=0.5)
    for bad in ({"evaluation": "devices"}, {"eval_epsilon": 0.0},
                {"eval_epsilon": math.inf}, {"eval_fraction": 1.5}, {"eval_clip": -1.0}):
        with pytest.raises(ConfigError):
            FedConfig(**bad)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def setting(fed_data: Any, make_model: Callable[..., Any]) -> dict[str, Any]:
    """The tiny population's model, its test impressions, and the server-side reference:
    ``evaluate_model``'s scores of the same impressions, averaged per impression over the
    evaluable ones (the estimand when K is at least every user's impression count)."""
    model = make_model("nrms", seed=0)
    task = LocalObjective(model)
    clients = fed_data.clients
    test = fed_data.dataset.test
    enrolled = set(clients.user_ids)
    split = type(test)(news=test.news, path=test.path, behaviors=[
        imp for imp in test.behaviors if imp.user_id in enrolled and imp.labels is not None])
    scored = score_impressions(model, split, fed_data.features, history_len=5)
    pairs = [p for p in scored.pairs if evaluable(p[0])]
    server = evaluate_impressions(pairs)
    per_user: dict[str, int] = {}
    for imp, (labels, _) in zip(split.behaviors, scored.pairs):
        if evaluable(labels):
            per_user[imp.user_id] = per_user.get(imp.user_id, 0) + 1
    return {"task": task, "clients": clients, "params": task.parameters(),
            "data": TestImpressions(split, fed_data.features, history_len=5),
            "server": server, "count": len(pairs), "clip": float(max(per_user.values())),
            "users": len(clients.user_ids)}


@pytest.fixture
def scored_once(setting: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The devices' scores of θ computed once (θ does not change between the evaluations
    of a check; every release is still drawn and aggregated by the real code)."""
    cache: dict[tuple[str, ...], Any] = {}
    score = fed_evaluation.score_users

    def cached(model: Any, data: Any, users: Any) -> Any:
        key = tuple(users)
        if key not in cache:
            cache[key] = score(model, data, users)
        return cache[key]

    monkeypatch.setattr(fed_evaluation, "score_users", cached)


def agreement_failures(setting: dict[str, Any], policy: EvaluationPolicy, *,
                       runs: int = RUNS) -> list[str]:
    """Run ``runs`` federated evaluations through the training loop's evaluation step and
    list every way they disagree with the server-side reference beyond the accounted noise:
    an estimate off by more than 4σ, z-scores whose variance is not about 1 (noise missing
    or wrong), a noised count off its expectation, or a ledger that does not hold exactly one
    release per asked user and evaluation."""
    clients, server, count = setting["clients"], setting["server"], setting["count"]
    evaluation = FederatedEvaluation(policy, setting["data"])
    evaluate_fn = local_evaluate_fn(setting["task"], clients.user_ids, setting["data"],
                                    policy, seed=11)
    state = FederatedState(params=setting["params"], strategy_state={})
    n = setting["users"]
    sum_std = policy.sigma * math.sqrt(n)
    failures: list[str] = []
    z: dict[str, list[float]] = {m: [] for m in (*METRICS, "count")}
    for r in range(runs):
        result = simulator._evaluate_federated(state, clients, evaluation, evaluate_fn,
                                               seed=11, round_index=r, source=None)
        for m in METRICS:
            accounted = sum_std * math.sqrt(1 + server[m] ** 2) / count
            z[m].append((result[m] - server[m]) / accounted)
            if abs(result[m] - server[m]) > 4 * result["std"][m]:
                failures.append(f"run {r}: {m} {result[m]:.4f} is more than 4 sigma "
                                f"({result['std'][m]:.4f}) from {server[m]:.4f}")
        z["count"].append((result["count"] - count) / sum_std)
    for name, values in z.items():
        variance, mean = float(np.var(values)), float(np.mean(values))
        if not 0.4 < variance < 1.8:
            failures.append(f"{name}: variance of the z-scores {variance:.3f}, expected 1")
        if abs(mean) > 4 / math.sqrt(runs):
            failures.append(f"{name}: mean z-score {mean:.3f}, expected 0")
    events = {uid: state.ledger.events(uid) for uid in clients.user_ids}
    if any(ev != [(policy.event, runs)] for ev in events.values()):
        failures.append("the ledger does not hold one evaluation release per user and run")
    return failures


def _policy(setting: dict[str, Any]) -> EvaluationPolicy:
    # A large epsilon keeps the noise of 40 users' releases comparable with the metrics.
    return EvaluationPolicy(epsilon=50.0, delta=1e-6, clip=setting["clip"])


def test_federated_evaluation_agrees_with_the_server_side_one(setting: dict[str, Any],
                                                               scored_once: None) -> None:
    policy = _policy(setting)
    assert agreement_failures(setting, policy) == []


def test_the_agreement_check_catches_a_release_without_noise(
        setting: dict[str, Any], scored_once: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unnoised(vector: torch.Tensor, policy: EvaluationPolicy, source: Any) -> torch.Tensor:
        return vector.to(torch.float64).clamp(0.0, policy.clip)

    monkeypatch.setattr(fed_evaluation, "release", unnoised)
    failures = agreement_failures(setting, _policy(setting), runs=15)
    assert any("variance" in f for f in failures)


def test_the_agreement_check_catches_users_counted_twice(
        setting: dict[str, Any], scored_once: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sample = simulator.evaluation_sample
    monkeypatch.setattr(simulator, "evaluation_sample",
                        lambda *a, **k: sorted(sample(*a, **k) * 2))
    failures = agreement_failures(setting, _policy(setting), runs=15)
    assert any(f.startswith("count") for f in failures)
    assert any("ledger" in f for f in failures)


def test_training_runs_federated_evaluations_into_the_ledger(
        setting: dict[str, Any], fed_data: Any, client_method: Callable[..., Any],
        run_config: Callable[..., Any], make_objective: Callable[..., Any]) -> None:
    """After every eval_every rounds and after the last, every enrolled user (fraction 1)
    is asked, charged once in the ledger, and the estimate is logged."""
    config = run_config("fedrec", rounds=2, eval_every=1, clients_per_round=4,
                        evaluation="federated", eval_epsilon=5.0)
    policy = evaluation_policy(config.fed)
    assert policy is not None
    task = make_objective("nrms", seed=0)
    state = train_federated(task, fed_data.clients, config.fed,
                            client_method("fedrec"), build_strategy(config.fed), seed=0,
                            progress=False,
                            evaluation=FederatedEvaluation(policy, setting["data"]))
    logged = [entry["round"] for entry in state.log if "federated_eval" in entry]
    assert logged == [1, 2]
    last = state.log[-1]["federated_eval"]
    assert last["devices"] == setting["users"] and set(METRICS) <= set(last)
    for uid in fed_data.clients.user_ids:
        assert (policy.event, 2) in state.ledger.events(uid)


def test_a_ledger_composes_evaluations_with_training() -> None:
    policy = EvaluationPolicy(epsilon=1.0, delta=1e-6)
    ledger = PrivacyLedger()
    ledger.record("u", policy.event, 3)
    three = ledger.user_epsilon("u", delta=1e-5, adjacency="user")
    assert 1.0 < three < 3.0  # PLD composition of three Gaussian releases


def test_a_device_pins_the_evaluation_policy_and_answers_each_evaluation_once(
        tmp_path: Any, client_method: Callable[..., Any]) -> None:
    """The device guard pins the evaluation's policy with the method's, answers each
    evaluation once per (run, round) (apart from the round's training release), and refuses
    evaluations its budget cannot pay for."""
    from privaterec.fed.device_guard import DeviceGuard, RoundRefused, privacy_policy

    method = client_method("dp-fedrec")
    policy = EvaluationPolicy(epsilon=4.0)
    pinned = privacy_policy(method, policy)
    guard = DeviceGuard(tmp_path, budget=10.0)
    guard.enrol(pinned)
    with pytest.raises(RoundRefused, match="evaluation.epsilon: 4.0 -> 8.0"):
        guard.enrol(privacy_policy(method, EvaluationPolicy(epsilon=8.0)))

    def evaluate(round_index: int, policy_now: dict[str, str] = pinned) -> None:
        guard.admit(run=1, round_index=round_index, policy=policy_now, secure_message=False,
                    secure_required=False, events=[(policy.event, 1)], kind="evaluate")

    with pytest.raises(RoundRefused, match="departs"):  # the server dropped the evaluation
        evaluate(0, privacy_policy(method))
    evaluate(0)
    guard.admit(run=1, round_index=0, policy=pinned, secure_message=False,
                secure_required=False, events=[], kind="train")  # the round's own release
    with pytest.raises(RoundRefused, match="already answered"):
        evaluate(0)
    answered = 1
    with pytest.raises(RoundRefused, match="budget"):
        for t in range(1, 10):
            evaluate(t)
            answered += 1
    assert guard.answered_evaluations() == [(1, t) for t in range(answered)]
    assert guard.answered() == [(1, 0)]
    assert 0 < guard.spent() <= 10.0
