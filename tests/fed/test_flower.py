"""The Flower engine trains exactly what the in-process simulator trains.

``fed.engine = "flower"`` runs the ServerApp and the ClientApps in Flower's simulation
runtime (Ray, 2 CPUs, one SuperNode per user); every client update is computed in a Ray
worker from data the ClientApp rebuilt itself. With the same seed, the parameters after
two rounds and the privacy ledgers must equal those of ``engine = "simulator"`` — with
per-client Laplace noise (fednewsrec), and with FedAdam on raw gradients (fedrec).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower engine needs flwr[simulation] (test extra)")

from privaterec.config import (FedConfig, ModelConfig, RunConfig, TrainConfig,  # noqa: E402
                               fed_config, fed_with_changes, replace)
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402
from privaterec.errors import ConfigError  # noqa: E402
from privaterec.apps.flower_app import run_config_from_flower  # noqa: E402
from privaterec.fed import flower  # noqa: E402
from privaterec.fed.flower import server_app  # noqa: E402
from privaterec.fed.methods import (ClientMethod, method_from_config,  # noqa: E402
                                    resolve_run_config)
from privaterec.fed.objective import LocalObjective  # noqa: E402
from privaterec.fed.simulator import eligible_clients, sample_round  # noqa: E402
from privaterec.models.factory import build_recommender  # noqa: E402
from privaterec.privacy.ledger import PrivacyLedger  # noqa: E402
from privaterec.runtime.checkpoint import load_checkpoint  # noqa: E402
from privaterec.runs.ranking import prepare_data, train_run  # noqa: E402

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
SEED, ROUNDS, PER_ROUND = 3, 2, 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("flower") / "data"
    write_synthetic(path, SynthConfig(users=12, news=60, seed=5))
    return path


# PrivateRec with noise: padding, DPA noise and DPL labels are drawn on the devices. The
# engines' round gradients agree to ~2e-8 (one backward vs per-client sums); FedAdam with
# τ = 1e-6 turns such differences on coordinates whose gradient is ~τ into ~1e-4 parameter
# differences, so this comparison uses τ = 1e-3, under which they stay below 1e-6.
FED_CHANGES = {"privaterec": {"epsilon_train": 5.0, "adam_tau": 1e-3, "privacy_mode": "paper"}}


def _config(data_dir, method: str, engine: str) -> RunConfig:
    return RunConfig(data=str(data_dir), model=TINY,
                     train=TrainConfig(method=method, seed=SEED),
                     fed=fed_config(method, rounds=ROUNDS, clients_per_round=PER_ROUND,
                                    engine=engine, **FED_CHANGES.get(method, {})))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fednewsrec", "fedrec", "privaterec"])
def test_flower_engine_equals_simulator(data_dir, tmp_path, monkeypatch, method):
    discovered: list[dict[int, int]] = []
    timeouts: list[float] = []
    replies: list[int] = []
    discover, parse = server_app.discover_nodes, server_app._parse_reply

    def spy_discover(*args, **kwargs):
        timeouts.append(kwargs["timeout"])
        discovered.append(discover(*args, **kwargs))
        return discovered[-1]

    def spy_parse(reply, *args):
        replies.append(reply.metadata.src_node_id)
        return parse(reply, *args)

    monkeypatch.setattr(server_app, "discover_nodes", spy_discover)
    monkeypatch.setattr(server_app, "_parse_reply", spy_parse)

    runs = {}
    for engine in ("simulator", "flower"):
        metrics = train_run(_config(data_dir, method, engine), tmp_path / engine,
                            progress=False)
        runs[engine] = (load_checkpoint(tmp_path / engine / "checkpoint.pt"), metrics)
    (sim, sim_metrics), (flw, flw_metrics) = runs["simulator"], runs["flower"]

    # The rounds really went through Flower: one SuperNode per user, one reply per client.
    prepared = prepare_data(_config(data_dir, method, "flower"))
    eligible = eligible_clients(prepared.train_clients)
    assert len(discovered) == 1
    # The simulation started its SuperNodes: it waits for them like for a round (a loaded
    # machine may take minutes to answer), not the deployment's wait for missing devices.
    assert timeouts == [server_app.ROUND_TIMEOUT] and server_app.ROUND_TIMEOUT > server_app.DISCOVERY_TIMEOUT
    assert sorted(discovered[0]) == eligible.tolist()
    assert len(set(discovered[0].values())) == len(eligible)
    assert len(replies) == ROUNDS * PER_ROUND

    # Training moved θ away from θ0, so equality below is not vacuous.
    torch.manual_seed(SEED)
    model = build_recommender(resolve_run_config(_config(data_dir, method, "flower")).model,
                              prepared.vocabs, prepared.features)
    theta0 = LocalObjective(model).parameters()
    assert (sim["params"] - theta0).abs().max() > 1e-3
    assert torch.allclose(flw["params"], sim["params"], rtol=0, atol=1e-6)
    for a, b in zip(flw["log"], sim["log"]):
        assert (a["round"], a["clients"]) == (b["round"], b["clients"])
        if method == "fedrec":  # the only method whose clients send counts and losses
            assert a["samples"] == b["samples"]
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        else:  # a private method's server learns neither
            assert "samples" not in a and "loss" not in a

    ledger = PrivacyLedger.from_dict(flw["ledger"])
    assert ledger == PrivacyLedger.from_dict(sim["ledger"])
    selected = [u for t in range(ROUNDS)
                for u in sample_round(eligible, PER_ROUND, seed=SEED, round_index=t)]
    per_round = len(method_from_config(
        resolve_run_config(_config(data_dir, method, "flower"))).events(theta0.numel()))
    expected = {prepared.train_clients.user_ids[u]: per_round * selected.count(u)
                for u in set(selected)}
    assert {u: sum(c for _, c in ledger.events(u)) for u in ledger.users} == expected
    assert flw_metrics["test"]["auc"] == pytest.approx(sim_metrics["test"]["auc"], abs=1e-6)


def test_fingerprint_tells_public_models_and_methods_apart(data_dir):
    config = resolve_run_config(_config(data_dir, "fednewsrec", "flower"))
    prepared = prepare_data(config)
    method = method_from_config(config)

    def fingerprint(seed: int, method: ClientMethod) -> str:
        torch.manual_seed(seed)
        model = build_recommender(TINY, prepared.vocabs, prepared.features)
        return flower.public_fingerprint(LocalObjective(model), method)

    reference = fingerprint(SEED, method)
    assert fingerprint(SEED, method) == reference
    # Random frozen word vectors are not in θ: another init is another public model.
    assert TINY.freeze_embeddings
    assert fingerprint(SEED + 1, method) != reference
    noisier = method_from_config(replace(config, fed=fed_with_changes(
        config.fed, "fednewsrec", {"noise_scale": 0.03})))
    assert fingerprint(SEED, noisier) != reference


def test_flwr_run_config_overrides_the_yaml(tmp_path):
    yaml = tmp_path / "run.yaml"
    RunConfig(model=TINY, train=TrainConfig(method="fedrec", seed=7),
              fed=FedConfig(rounds=9, eval_every=3)).to_yaml(yaml)
    run_config = {"data-dir": str(tmp_path / "data"), "out-dir": str(tmp_path / "run"),
                  "config": str(yaml), "method": "", "rounds": 2, "clients-per-round": 0,
                  "seed": -1, "eval-every": 0, "drop-missing": True}
    config, out, drop_missing = run_config_from_flower(run_config)
    assert (config.train.method, config.train.seed, config.fed.rounds) == ("fedrec", 7, 2)
    assert (config.fed.eval_every, config.fed.engine, config.model) == (0, "flower", TINY)
    assert config.fed.clients_per_round is None and config.fed.strategy == "fedadam"
    assert out == tmp_path / "run" and drop_missing is True
    with pytest.raises(ConfigError, match="out-dir"):
        run_config_from_flower({**run_config, "out-dir": "relative/run"})
    with pytest.raises(ConfigError, match="method"):
        run_config_from_flower({**run_config, "config": "", "method": ""})


RANKER_MODEL = ModelConfig(word_dim=16, num_heads=2, head_dim=8, attention_dim=16,
                           title_len=6, abstract_len=4, history_len=5)


@pytest.mark.slow
def test_flower_engine_equals_simulator_for_unifedrec(data_dir, tmp_path, monkeypatch):
    """Uni-FedRec's recall model trains on the same engine: on Flower (its LDP uploads
    computed by ClientApps that rebuilt the recall task from recall.yaml and the ranker)
    it ends with the simulator's parameters and ledger."""
    from privaterec.recall.task import recall_fed_config
    from privaterec.runs.recall import (RecallModelConfig, RecallRunConfig, recall_setup,
                                        train_recall_run)

    replies: list[int] = []
    parse = server_app._parse_reply

    def spy_parse(reply, *args):
        replies.append(reply.metadata.src_node_id)
        return parse(reply, *args)

    monkeypatch.setattr(server_app, "_parse_reply", spy_parse)
    ranker = tmp_path / "ranker"
    train_run(RunConfig(data=str(data_dir), model=RANKER_MODEL,
                        train=TrainConfig(method="fedrec", seed=SEED),
                        fed=FedConfig(rounds=1, clients_per_round=PER_ROUND)),
              ranker, progress=False)
    runs = {}
    for engine in ("simulator", "flower"):
        config = RecallRunConfig(
            ranker=str(ranker), seed=SEED,
            model=RecallModelConfig(num_basis=4, distance_threshold=0.3),
            fed=recall_fed_config(rounds=ROUNDS, clients_per_round=PER_ROUND,
                                  engine=engine, noise_scale=0.05))
        metrics = train_recall_run(config, tmp_path / engine, progress=False)
        runs[engine] = (load_checkpoint(tmp_path / engine / "checkpoint.pt"), metrics)
    (sim, sim_metrics), (flw, flw_metrics) = runs["simulator"], runs["flower"]

    assert len(replies) == ROUNDS * PER_ROUND  # every upload came through a ClientApp
    from privaterec.data.mind import load_dataset
    theta0 = recall_setup(config, load_dataset(data_dir)).model
    theta0 = torch.cat([p.detach().reshape(-1) for p in theta0.parameters()])
    assert (sim["params"] - theta0).abs().max() > 1e-3  # training moved θ
    assert torch.allclose(flw["params"], sim["params"], rtol=0, atol=1e-6)
    assert PrivacyLedger.from_dict(flw["ledger"]) == PrivacyLedger.from_dict(sim["ledger"])
    assert [(e["round"], e["clients"]) for e in flw["log"]] == \
        [(e["round"], e["clients"]) for e in sim["log"]]
    assert all("loss" not in e for e in flw["log"])  # private uploads: no loss on the server
    assert flw_metrics["users_trained"] == sim_metrics["users_trained"] > 0
    assert flw_metrics["train_epsilon_per_round"] == pytest.approx(2 * 0.1 / 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("clip_space", ["parameters", "news_vectors"])
def test_flower_secaggplus_equals_the_simulators_dp_fedavg(data_dir, tmp_path, monkeypatch,
                                                           clip_space):
    """dp-fedavg on Flower's Ray runtime with SecAgg+ and the server's (seeded) noise ends
    with the simulator's parameters to quantisation tolerance (each client's coordinates
    are rounded toward zero on a grid of step 2^-26 here, tests/fed/test_secagg.py) and
    with its privacy accounting; every round's sum came out of a SecAgg+ session. Clipped
    in parameter space and in news-vector space (each device then uploads its user-side
    gradient and the cotangents of every news of the table)."""
    sessions: list[int] = []
    secure_sum = server_app.secure_sum

    def spy(grid, plan, nodes, fitins, **kwargs):
        out = secure_sum(grid, plan, nodes, fitins, **kwargs)
        sessions.append(out[1])
        return out

    monkeypatch.setattr(server_app, "secure_sum", spy)
    fed = dict(rounds=ROUNDS, client_fraction=0.5, noise_multiplier=1.0, target_delta=1e-3,
               adam_tau=1e-3, clip_space=clip_space)
    runs = {}
    for engine, secure in (("simulator", "none"), ("flower", "secaggplus")):
        config = RunConfig(data=str(data_dir), model=TINY,
                           train=TrainConfig(method="dp-fedavg", seed=SEED),
                           fed=fed_config("dp-fedavg", engine=engine,
                                          secure_aggregation=secure, **fed))
        train_run(config, tmp_path / engine, progress=False)
        runs[engine] = load_checkpoint(tmp_path / engine / "checkpoint.pt")
    sim, flw = runs["simulator"], runs["flower"]
    assert sessions == [e["clients"] for e in sim["log"]] and min(sessions) >= 2
    assert (sim["params"] - flw["params"]).abs().max() <= 1e-6
    assert (sim["params"] - theta0_of(data_dir)).abs().max() > 1e-3  # training moved θ
    sim_events = PrivacyLedger.from_dict(sim["ledger"]).events
    flw_ledger = PrivacyLedger.from_dict(flw["ledger"])
    for user in flw_ledger.users:  # the same release, its note stating SecAgg+
        (sim_event, n), = sim_events(user)
        (flw_event, m), = flw_ledger.events(user)
        assert (flw_event.epsilon, flw_event.delta, flw_event.noise_scale, m) == \
            (sim_event.epsilon, sim_event.delta, sim_event.noise_scale, n)
        assert "SecAgg+" in flw_event.note and "SecAgg+" not in sim_event.note


def theta0_of(data_dir) -> torch.Tensor:
    config = resolve_run_config(RunConfig(data=str(data_dir), model=TINY,
                                          train=TrainConfig(method="fedrec", seed=SEED)))
    prepared = prepare_data(config)
    torch.manual_seed(SEED)
    return LocalObjective(build_recommender(config.model, prepared.vocabs,
                                            prepared.features)).parameters()
