"""Central DP through Flower's SecAgg+: quantisation, noise shares, rounds.

The rounds run the real Flower code — ``secaggplus_mod`` on every client,
``SecAggPlusWorkflow`` on the server, the engine's own round function and ClientApp handlers
— over :class:`LocalGrid`, an in-process Grid that hands each message to the addressed
node's handler (one ``Context`` per node, as a SuperNode keeps it). That keeps these tests
fast and lets them drop a client, spy on what the server receives and switch the noise off;
``tests/fed/test_flower.py`` runs the same through Flower's Ray simulation runtime.
"""

from __future__ import annotations

import math
from dataclasses import replace as dc_replace
from typing import Any, Callable

import numpy as np
import pytest
import torch
from scipy import stats

pytest.importorskip("flwr", reason="secure aggregation needs flwr")

from flwr.app import Context, Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.common import FitIns, bytes_to_ndarray, ndarrays_to_parameters  # noqa: E402
from flwr.common.secure_aggregation.quantization import quantize  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import (  # noqa: E402
    RECORD_KEY_CONFIGS, Key, Stage)

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config  # noqa: E402
from privaterec.method_settings import DPFedAvgSettings  # noqa: E402
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402
from privaterec.errors import CheckpointError, ConfigError, PrivateRecError  # noqa: E402
from privaterec.fed import flower  # noqa: E402
from privaterec.fed.flower import client_app, messages, secure, server_app  # noqa: E402
from privaterec.fed.engine import check_engine  # noqa: E402
from privaterec.fed.methods import method_from_config, resolve_run_config  # noqa: E402
from privaterec.fed.methods.dp_fedavg import CentralDP  # noqa: E402
from privaterec.fed.news_space import NewsSpaceClipping  # noqa: E402
from privaterec.fed.objective import LocalObjective  # noqa: E402
from privaterec.fed.rng import aggregator_noise, client_noise  # noqa: E402
from privaterec.fed.secagg import (MIN_BITS, SecAggRound, min_clients,  # noqa: E402
                                   plan_round, quantization_bits)
from privaterec.fed.simulator import simulate_round, train_federated  # noqa: E402
from privaterec.fed.strategies import build_strategy  # noqa: E402
from privaterec.models.factory import build_recommender  # noqa: E402
from privaterec.privacy.samplers import SecureNoise, SimulationNoise  # noqa: E402
from privaterec.runs.ranking import prepare_data, train_run  # noqa: E402
from privaterec.runs.report import central_dp_release  # noqa: E402

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
SEED, USERS = 3, 12
FIT_ALPHA = 1e-6  # goodness-of-fit level (SecureNoise cannot be seeded: keep false alarms rare)


# ================================================================ quantisation and plans
def test_quantisation_rounds_toward_zero_on_secaggs_exact_grid():
    plan = plan_round(clients=10, max_dropouts=1, clip=0.1, sigma=0.1, distributed=False)
    assert plan.clipping_range == 0.125 and plan.bits == 24  # c: power of two >= C
    x = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    x = x * (0.1 / torch.linalg.vector_norm(x))  # ||x|| = C (float32)
    q = plan.quantize(x)
    assert q.dtype == torch.float64
    assert torch.equal(q / plan.step, torch.round(q / plan.step))  # grid values
    assert bool((q.abs() <= x.double().abs()).all())  # toward zero, coordinate by coordinate
    assert float(torch.linalg.vector_norm(q)) <= 0.1  # sensitivity stays C
    assert float((q - x.double()).abs().max()) < 2 * plan.step
    # SecAgg+'s own stochastic rounding then has nothing to round: its integers are exact,
    # every time, and its clip to [-c, c] does not act.
    ints = [quantize([q.numpy()], plan.clipping_range, plan.quantization_range)[0]
            for _ in range(3)]
    expected = (q.numpy() + plan.clipping_range) * plan.quantization_range / (
        2 * plan.clipping_range)
    assert np.array_equal(expected, np.round(expected))
    for got in ints:
        assert np.array_equal(got, expected.astype(np.int64))


def test_the_float32_clip_cannot_push_the_quantised_norm_above_c():
    plan = plan_round(clients=4, max_dropouts=0, clip=0.1, sigma=0.1, distributed=False)
    x = torch.full((4,), 0.05 + 4 * plan.step, dtype=torch.float64)  # norm 0.1 + 8 steps
    q = plan.quantize(x)
    assert float(torch.linalg.vector_norm(q)) <= 0.1
    assert float((x - q).abs().max()) <= 6 * plan.step


def test_modulus_rules_out_wraparound_and_too_many_clients_are_refused():
    for n in (2, 3, 40, 255, 256, 1000, 50_000):
        plan = plan_round(clients=n, max_dropouts=0, clip=0.1, sigma=0.1, distributed=False)
        assert n * plan.quantization_range < plan.modulus <= 2 ** 32  # sum of n values in [0, Q]
        assert plan.modulus > plan.quantization_range  # SecAgg+'s own requirement
        assert plan.modulus & (plan.modulus - 1) == 0  # a power of two
    assert quantization_bits(40) == 24 and quantization_bits(50_000) == 16
    with pytest.raises(ConfigError, match="quantisation bits"):
        quantization_bits(2 ** (32 - MIN_BITS))
    assert min_clients(0) == 2 and min_clients(1) == 3 and min_clients(3) == 7
    with pytest.raises(ConfigError, match="at least 3 clients"):
        plan_round(clients=2, max_dropouts=1, clip=0.1, sigma=0.1, distributed=False)


def test_distributed_plan_leaves_room_for_the_noise_tail():
    plan = plan_round(clients=20, max_dropouts=2, clip=0.1, sigma=0.1, distributed=True)
    assert plan.share_sigma == pytest.approx(0.1 / math.sqrt(18))
    room = plan.clipping_range - plan.clip - plan.step / 2
    assert room >= 13 * plan.share_sigma
    assert plan.tail_bound(10 ** 6) < 1e-30
    assert plan.share_sigma >= 16 * plan.step
    with pytest.raises(ConfigError, match="quantisation steps"):  # share finer than the grid
        plan_round(clients=50_000, max_dropouts=0, clip=0.1, sigma=1e-5, distributed=True)


def _variance_p(x: np.ndarray, variance: float) -> float:
    """Two-sided p-value of "x holds i.i.d. N(0, variance)" (chi-square on Σx²)."""
    chi2 = float((x ** 2).sum() / variance)
    return 2 * min(stats.chi2.cdf(chi2, x.size), stats.chi2.sf(chi2, x.size))


@pytest.mark.parametrize("source", ["simulation", "secure"])
def test_distributed_shares_sum_to_the_stated_variance(source):
    """The n − k surviving shares of a round carry N(0, σ²) per coordinate on the sum
    (chi-square on the sum of squares at α = 1e-6; it rejects one share fewer)."""
    n, k, sigma, D = 6, 2, 0.1, 4_000
    plan = plan_round(clients=n, max_dropouts=k, clip=0.1, sigma=sigma, distributed=True)
    zero = torch.zeros(D)
    sources = ([SecureNoise()] * n if source == "secure"
               else [client_noise(0, 0, u) for u in range(n)])
    shares = torch.stack([plan.client_vector(zero, s) for s in sources])
    assert torch.equal(shares / plan.step, torch.round(shares / plan.step))  # on the grid
    survivors = shares[: n - k].sum(0).numpy()  # k dropped out: the guaranteed noise
    assert _variance_p(survivors, sigma ** 2) > FIT_ALPHA
    assert abs(float(survivors.mean())) < 6 * sigma / math.sqrt(D)  # unbiased (6 sd)
    # Power: had the shares been calibrated for one more survivor (n − k + 1), the sum of
    # n − k of them would carry (n − k)/(n − k + 1) of σ², which the test rejects.
    assert _variance_p(survivors, sigma ** 2 * (n - k + 1) / (n - k)) < 1e-9
    # No dropout: the sum carries n/(n − k) of σ², at least the guarantee.
    assert _variance_p(shares.sum(0).numpy(), sigma ** 2 * n / (n - k)) > FIT_ALPHA


# ============================================================== in-process Flower rounds
def _wire(message: Message) -> Message:
    """The message as its receiver gets it: serialized and parsed, as Flower transports it
    (SecAgg+'s mod changes the records it receives)."""
    return message_from_proto(message_to_proto(message))


class LocalGrid:
    """A Grid delivering each message to the handler of its node, in process, through
    Flower's wire format.

    ``drop(node, message) -> bool``: that node does not answer (a dropout). ``replies``
    keeps every reply the server received, for spying on what it sees.
    """

    def __init__(self, handler: Callable[[Message, Context], Message],
                 node_configs: dict[int, dict[str, Any]]) -> None:
        self.handler = handler
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg, state=RecordDict(),
                                    run_config={}) for n, cfg in node_configs.items()}
        self.drop: Callable[[int, Message], bool] = lambda node, message: False
        self.replies: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        out = []
        for message in messages:
            node = message.metadata.dst_node_id
            if self.drop(node, message):
                continue
            received = _wire(message)
            try:
                reply = self.handler(received, self.contexts[node])
            except Exception as error:  # noqa: BLE001 - the node's failure, as Flower reports it
                reply = Message(Error(code=0, reason=repr(error)), reply_to=received)
            out.append(_wire(reply))
        self.replies += out
        return out


pytestmark = pytest.mark.usefixtures("flower_task_identity")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("secagg") / "data"
    write_synthetic(path, SynthConfig(users=USERS, news=60, seed=5))
    return path


def _config(data_dir, **fed: Any) -> RunConfig:
    settings = dict(rounds=2, client_fraction=0.5, noise_multiplier=1.0, target_delta=1e-3,
                    adam_tau=1e-3, engine="flower", secure_aggregation="secaggplus")
    settings.update(fed)
    return resolve_run_config(RunConfig(data=str(data_dir), model=TINY,
                                        train=TrainConfig(method="dp-fedavg", seed=SEED),
                                        fed=fed_config("dp-fedavg", **settings)))


class Setup:
    """The run's public task, method and clients, and a LocalGrid of one node per user."""

    def __init__(self, data_dir, tmp_path, *,
                 silent: tuple[int, Callable[..., Any]] | None = None, **fed: Any) -> None:
        self.config = _config(data_dir, **fed)
        self.prepared = prepare_data(self.config)
        self.method = method_from_config(self.config)
        assert isinstance(self.method, CentralDP)
        self.clients = self.prepared.train_clients
        if silent is not None:  # (user, strip_clicks): that user's impressions lose their clicks
            user, strip_clicks = silent
            self.clients = strip_clicks(self.prepared.dataset.train, self.prepared.features,
                                        self.clients.user_ids[user],
                                        history_len=int(self.clients.history.shape[1]))
        self.task = self.new_task()
        device = flower.Device.of(self.new_task(), self.method, self.clients)
        self.loader = lambda spec: device  # what load_device rebuilds on a SuperNode
        users = self.clients.num_users
        nodes = {1000 + p: {"run-dir": str(tmp_path), "partition-id": p,
                            "num-partitions": users} for p in range(users)}

        def handler(message: Message, context: Context) -> Message:
            if message.metadata.message_type == MessageType.QUERY:
                return client_app.client_query(self.loader, message, context)
            return client_app.handle_train(self.loader, message, context)

        self.grid = LocalGrid(handler, nodes)

    def new_task(self) -> LocalObjective:
        torch.manual_seed(SEED)  # the public model exactly as the run layer builds it
        return LocalObjective(build_recommender(self.config.model, self.prepared.vocabs,
                                                self.prepared.features))

    @property
    def population(self) -> int:
        return len(self.method.population(self.clients))

    def train_flower(self, **kwargs: Any):
        task = self.new_task()
        kwargs.setdefault("deployed", False)  # seeded like the simulator, to compare
        return flower.serve(self.grid, task, self.clients, self.config.fed, self.method,
                            build_strategy(self.config.fed), seed=SEED, run_files={},
                            progress=False, **kwargs)

    def train_simulator(self):
        return train_federated(self.new_task(), self.clients, self.config.fed, self.method,
                               build_strategy(self.config.fed), seed=SEED, progress=False)

    def round_fn(self):
        owner = flower.discover_nodes(self.grid, self.clients, flower.run_record({}))
        return server_app._secure_round_fn(self.grid, self.task, self.clients, owner, self.method,
                                       flower.public_fingerprint(self.task, self.method),
                                       seed=SEED, timeout=60.0, deployed=False)

    def selected(self, t: int) -> list[int]:
        return self.method.select(self.method.population(self.clients), 0, seed=SEED,
                                  round_index=t)


def _collect_replies(grid: LocalGrid) -> list[Message]:
    """The replies of SecAgg+'s collect stage: each client's masked vector."""
    return [r for r in grid.replies if not r.has_error()
            and RECORD_KEY_CONFIGS in r.content.config_records
            and Key.MASKED_PARAMETERS in r.content.config_records[RECORD_KEY_CONFIGS]]


def test_secure_round_equals_the_simulators_round_to_quantisation_tolerance(data_dir,
                                                                            tmp_path):
    s = Setup(data_dir, tmp_path)
    selected = s.selected(0)
    plan = s.method.secure_round(len(selected))
    assert plan is not None and len(selected) >= 3
    params = s.task.parameters()
    flw = s.round_fn()(params, selected, 0)
    sim = simulate_round(s.task, params, s.clients, selected, s.method, seed=SEED,
                         round_index=0)
    # Per coordinate: each client's quantisation error is below 2 steps (toward zero), the
    # float32 sums differ by rounding; the same seeded noise N(0, z²C²) on both.
    tolerance = plan.tolerance() / (s.method.sampling_rate * s.population) + 1e-7
    diff = float((flw.direction - sim.direction).abs().max())
    assert diff <= tolerance
    assert float(sim.direction.abs().max()) > 1e3 * tolerance  # not vacuous
    assert flw.population_events == sim.population_events == (s.method.central_event(),)
    assert flw.num_examples is None and flw.losses is None  # the server learns neither
    assert len(_collect_replies(s.grid)) == len(selected)  # every client went through SecAgg+


def test_secure_training_equals_the_simulator(data_dir, tmp_path):
    """Two rounds on Flower's SecAgg+ (server noise, seeded as the simulator's) end with the
    simulator's parameters to quantisation tolerance and with its very ledger."""
    s = Setup(data_dir, tmp_path)
    flw, sim = s.train_flower(), s.train_simulator()
    theta0 = s.task.parameters()
    assert float((sim.params - theta0).abs().max()) > 1e-3  # training moved θ
    # FedAdam's step lr·m/(√v + τ) turns a direction error e into at most about
    # lr·e/τ per round (e ≤ 3.5e-8 + float32 rounding here, lr = 1e-2, τ = 1e-3):
    # ≤ 1e-6 over two rounds (measured: 6e-8).
    assert float((flw.params - sim.params).abs().max()) <= 1e-6
    assert flw.ledger == sim.ledger
    assert [(e["round"], e["clients"]) for e in flw.log] == \
        [(e["round"], e["clients"]) for e in sim.log]


@pytest.mark.parametrize("placement", ["central", "distributed"])
def test_a_sampled_user_without_a_sample_takes_part_with_a_zero_vector(
        data_dir, tmp_path, monkeypatch, strip_clicks, placement):
    """Under replacement one user's data may lose every training sample: the round must not
    change shape. Sampled, that user is in the SecAgg+ plan (n counts it), sends a masked
    zero vector (plus its noise share with distributed noise), and the sum is the
    simulator's."""
    fed = {"noise_placement": placement, "max_dropouts": 1} if placement == "distributed" \
        else {}
    s0 = Setup(data_dir, tmp_path, **fed)
    selected = s0.selected(0)
    silent = selected[1]
    s = Setup(data_dir, tmp_path, silent=(silent, strip_clicks), **fed)
    assert s.selected(0) == selected  # who is sampled does not depend on the data
    plan = s.method.secure_round(len(selected))
    assert plan is not None
    params = s.task.parameters()
    if placement == "distributed":  # compare the sums without the shares' noise
        monkeypatch.setattr(SecAggRound, "share_sigma", property(lambda self: 0.0))
        monkeypatch.setattr(SecAggRound, "check", lambda self: None)
    monkeypatch.setattr(CentralDP, "central_noise", lambda self, d, source: torch.zeros(d))
    flw = s.round_fn()(params, selected, 0)
    assert len(_collect_replies(s.grid)) == len(selected)  # it went through SecAgg+ too
    sim = simulate_round(s.task, params, s.clients, selected, s.method, seed=SEED,
                         round_index=0)
    without = simulate_round(s.task, params, s.clients,
                             [u for u in selected if u != silent], s.method, seed=SEED,
                             round_index=0)
    torch.testing.assert_close(sim.direction, without.direction)  # it added zero
    assert float(sim.direction.abs().max()) > 0
    tolerance = plan.tolerance() / (s.method.sampling_rate * s.population) + 1e-7
    assert float((flw.direction - sim.direction).abs().max()) <= tolerance


def test_secure_training_with_a_user_without_a_sample_equals_the_simulator(
        data_dir, tmp_path, strip_clicks):
    """The whole run: the server discovers the idle user's node, puts them in the rounds
    they are sampled in (the plan's n counts them), and ends where the simulator does."""
    silent = Setup(data_dir, tmp_path).selected(0)[1]
    s = Setup(data_dir, tmp_path, silent=(silent, strip_clicks))
    sizes = [len(s.selected(t)) for t in range(s.config.fed.rounds)]
    flw, sim = s.train_flower(), s.train_simulator()
    assert float((flw.params - sim.params).abs().max()) <= 1e-6
    assert flw.ledger == sim.ledger
    assert [e["clients"] for e in flw.log] == [e["clients"] for e in sim.log] == sizes
    collected = _collect_replies(s.grid)
    assert len(collected) == sum(sizes)  # every sampled user's masked vector, idle included
    # The server waits for the idle user's node too: without it the run cannot start.
    del s.grid.contexts[1000 + silent]
    with pytest.raises(PrivateRecError, match=f"1 of {s.population} training users are held"):
        s.train_flower(discovery_timeout=0.3)


def test_distributed_noise_equals_the_simulator_with_the_noise_switched_off(
        data_dir, tmp_path, monkeypatch):
    s = Setup(data_dir, tmp_path, noise_placement="distributed", max_dropouts=1)
    selected = s.selected(0)
    params = s.task.parameters()
    plan = s.method.secure_round(len(selected))
    assert plan is not None and plan.distributed
    with_noise = s.round_fn()(params, selected, 0).direction
    monkeypatch.setattr(SecAggRound, "share_sigma", property(lambda self: 0.0))
    monkeypatch.setattr(SecAggRound, "check", lambda self: None)
    monkeypatch.setattr(CentralDP, "central_noise", lambda self, d, source: torch.zeros(d))
    flw = s.round_fn()(params, selected, 0)
    sim = simulate_round(s.task, params, s.clients, selected, s.method, seed=SEED,
                         round_index=0)
    tolerance = plan.tolerance() / (s.method.sampling_rate * s.population) + 1e-7
    assert float((flw.direction - sim.direction).abs().max()) <= tolerance
    # The clients' shares were really there before: the noise on the direction has the
    # std σ/(qN)·√(n/(n−k)) (loose check; the variance test is above).
    noise = (with_noise - flw.direction).numpy()
    expected = plan.sigma / (s.method.sampling_rate * s.population) * math.sqrt(
        plan.clients / plan.threshold)
    assert float(noise.std()) == pytest.approx(expected, rel=0.1)


def _news_space_release(s: Setup, params: torch.Tensor, selected: list[int], *,
                        noise: bool = True) -> torch.Tensor:
    """The simulator's noised release of a news-vector round ``[D_U + P·d]`` (the seeded
    server noise of round 0, or none)."""
    inputs = [s.method.inputs(s.task, s.clients.client(u),
                              noise=client_noise(SEED, 0, u)) for u in selected]
    space = NewsSpaceClipping(s.task)
    if not noise:
        sums = space.clipped_sum(params, s.task.batch(inputs), clip=s.method.clip)
        return space.pack(sums.user, sums.news)
    user, news, _ = s.method.news_space_release(
        s.task, params, inputs, noise=aggregator_noise(SEED, 0))
    return space.pack(user, news)


class _ReleaseSpy:
    """Records the noised sums the server turns into θ's direction."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sums: list[torch.Tensor] = []
        original = CentralDP.direction_from_release

        def spy(method: CentralDP, task: Any, params: torch.Tensor,
                noised_sum: torch.Tensor) -> torch.Tensor:
            self.sums.append(noised_sum.clone())
            return original(method, task, params, noised_sum)

        monkeypatch.setattr(CentralDP, "direction_from_release", spy)


def test_news_vector_clipping_over_secaggplus_equals_the_simulator(data_dir, tmp_path,
                                                                    monkeypatch):
    """``--clip-space news_vectors`` on Flower: each device uploads clip(w_u, C) (D_U + P·d
    coordinates) through SecAgg+; the server's decoded, noised sum is the simulator's
    release to quantisation tolerance, and its direction is the server's backward pass of
    that sum over qN."""
    s = Setup(data_dir, tmp_path, clip_space="news_vectors")
    selected = s.selected(0)
    plan = s.method.secure_round(len(selected))
    assert plan is not None and len(selected) >= 3
    params = s.task.parameters()
    spy = _ReleaseSpy(monkeypatch)
    flw = s.round_fn()(params, selected, 0)
    (released,) = spy.sums
    sim = _news_space_release(s, params, selected)
    assert released.shape == sim.shape == (NewsSpaceClipping(s.task).release_dimension,)
    assert released.shape[0] > s.task.dimension - NewsSpaceClipping(s.task).news_mask.sum()
    assert float((released - sim).abs().max()) <= plan.tolerance() + 1e-7
    assert float((sim - _news_space_release(s, params, selected, noise=False)).abs().max()
                 ) > 1e3 * plan.tolerance()  # the server's noise is in both: not vacuous
    qn = s.method.sampling_rate * s.population
    torch.testing.assert_close(flw.direction, s.method.direction_from_release(
        s.task, params, released) / qn)
    round_sim = simulate_round(s.task, params, s.clients, selected, s.method, seed=SEED,
                               round_index=0)
    torch.testing.assert_close(round_sim.direction, s.method.direction_from_release(
        s.task, params, sim) / qn, rtol=1e-5, atol=1e-7)
    assert flw.population_events == (s.method.central_event(),)
    assert flw.num_examples is None and flw.losses is None
    masked = _collect_replies(s.grid)
    assert len(masked) == len(selected)  # every device went through SecAgg+
    for reply in masked:
        arrays = reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        assert bytes_to_ndarray(arrays[1]).shape == released.shape


def test_news_vector_clipping_with_distributed_noise(data_dir, tmp_path, monkeypatch):
    """Distributed noise in news-vector space: the devices' shares put N(0, σ²·n/(n − k))
    on every coordinate of the release (the rows of every news of the table included);
    without them the decoded sum is the simulator's clipped sum to quantisation tolerance."""
    s = Setup(data_dir, tmp_path, clip_space="news_vectors", noise_placement="distributed",
              max_dropouts=1)
    selected = s.selected(0)
    params = s.task.parameters()
    plan = s.method.secure_round(len(selected))
    assert plan is not None and plan.distributed
    spy = _ReleaseSpy(monkeypatch)
    s.round_fn()(params, selected, 0)
    monkeypatch.setattr(SecAggRound, "share_sigma", property(lambda self: 0.0))
    monkeypatch.setattr(SecAggRound, "check", lambda self: None)
    s.round_fn()(params, selected, 0)
    with_noise, without = spy.sums
    clean = _news_space_release(s, params, selected, noise=False)
    assert float((without - clean).abs().max()) <= plan.tolerance() + 1e-7
    noise = (with_noise - without).double()
    expected = plan.sigma * math.sqrt(plan.clients / plan.threshold)
    assert float(noise.std()) == pytest.approx(expected, rel=5 / math.sqrt(noise.numel()))
    news = NewsSpaceClipping(s.task)
    rows = noise[-news.pool_size * news.dim:].reshape(news.pool_size, news.dim)
    assert bool((rows.abs().sum(1) > 0).all())  # every news of the table is noised


def test_news_vector_training_over_secaggplus_equals_the_simulator(data_dir, tmp_path):
    """Two rounds of ``--clip-space news_vectors`` through SecAgg+ end with the simulator's
    parameters to quantisation tolerance (propagated through FedAdam as in
    :func:`test_secure_training_equals_the_simulator`) and with its very ledger."""
    s = Setup(data_dir, tmp_path, clip_space="news_vectors")
    flw, sim = s.train_flower(), s.train_simulator()
    assert float((sim.params - s.task.parameters()).abs().max()) > 1e-3  # θ moved
    assert float((flw.params - sim.params).abs().max()) <= 1e-6
    assert flw.ledger == sim.ledger


def test_a_dropout_within_the_bound_still_aggregates(data_dir, tmp_path):
    s = Setup(data_dir, tmp_path, max_dropouts=1)
    round_fn = s.round_fn()
    selected = s.selected(0)
    node_of = {1000 + u: u for u in range(USERS)}
    dropped = selected[0]

    def drop_in_collect(node: int, message: Message) -> bool:
        configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
        return (node_of.get(node) == dropped and configs is not None
                and configs.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS)

    s.grid.drop = drop_in_collect
    params = s.task.parameters()
    flw = round_fn(params, selected, 0)
    survivors = [u for u in selected if u != dropped]
    sim = simulate_round(s.task, params, s.clients, survivors, s.method, seed=SEED,
                         round_index=0)  # the survivors' updates and the same server noise
    plan = s.method.secure_round(len(selected))
    assert plan is not None
    tolerance = plan.tolerance() / (s.method.sampling_rate * s.population) + 1e-7
    assert float((flw.direction - sim.direction).abs().max()) <= tolerance
    # Two dropouts with max_dropouts = 1: the sum cannot be unmasked; the round fails.
    two = set(selected[:2])
    s.grid.drop = lambda node, message: (
        node_of.get(node) in two and message.content.config_records.get(
            RECORD_KEY_CONFIGS, {}).get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS)
    with pytest.raises(PrivateRecError, match="more than 1 dropped out"):
        round_fn(params, selected, 1 if len(s.selected(1)) >= 3 else 0)


def test_a_deployed_server_sends_no_seed_and_seeded_nodes_refuse_its_rounds(data_dir,
                                                                           tmp_path):
    s = Setup(data_dir, tmp_path)  # simulated partitions: no user-id, no os-entropy
    with pytest.raises(PrivateRecError, match="a deployed server sent this round"):
        s.train_flower(deployed=True)


@pytest.mark.parametrize("placement", ["central", "distributed"])
def test_a_deployed_round_draws_sample_noise_and_shares_from_the_os(data_dir, tmp_path,
                                                                    monkeypatch, placement):
    s = Setup(data_dir, tmp_path, noise_placement=placement)
    for context in s.grid.contexts.values():
        context.node_config["os-entropy"] = True  # as a real device (user-id) would
    seen: list[dict[str, Any]] = []
    secure_source = client_app.secure_source

    def spy(context: Context, config: Any) -> SecureNoise | None:
        seen.append(dict(config))
        return secure_source(context, config)

    monkeypatch.setattr(client_app, "secure_source", spy)
    sampled: list[list[int]] = []
    select = CentralDP.select

    def spy_select(self: CentralDP, *args: Any, **kwargs: Any) -> list[int]:
        assert isinstance(kwargs.get("source"), SecureNoise)
        sampled.append(select(self, *args, **kwargs))
        return sampled[-1]

    monkeypatch.setattr(CentralDP, "select", spy_select)
    noise_sources: list[Any] = []
    release_sum = CentralDP.release_sum

    def spy_noise(self: CentralDP, total: torch.Tensor, source: Any) -> torch.Tensor:
        noise_sources.append(source)
        assert total.dtype == torch.float64  # the decoded sum itself, not a float32 copy
        return release_sum(self, total, source)

    monkeypatch.setattr(CentralDP, "release_sum", spy_noise)
    checkpoint = tmp_path / "deployed.pt"
    state = s.train_flower(deployed=True, checkpoint_path=checkpoint)
    assert state.round_index == 2 and len(sampled) == 2
    # The server's own noise: from the OS with central placement, none with distributed.
    assert (all(isinstance(n, SecureNoise) for n in noise_sources) and len(noise_sources) == 2
            if placement == "central" else not noise_sources)
    # A deployed checkpoint records the mode: a seeded resume of it is refused.
    with pytest.raises(CheckpointError, match="written by a deployed run"):
        s.train_flower(deployed=False, checkpoint_path=checkpoint)
    assert seen and all("seed" not in c and c.get("deployed") is True for c in seen)
    assert bool(torch.isfinite(state.params).all())


def test_a_deployed_sample_is_not_a_function_of_the_seed(data_dir, tmp_path):
    s = Setup(data_dir, tmp_path)
    eligible = s.method.population(s.clients)
    seeded = s.method.select(eligible, 0, seed=SEED, round_index=0)
    assert seeded == s.method.select(eligible, 0, seed=SEED, round_index=0)
    draws = [s.method.select(eligible, 0, seed=SEED, round_index=0, source=SecureNoise())
             for _ in range(40)]  # q = 0.5 over 12 users: 40 equal draws has odds 2^-480
    assert any(d != seeded for d in draws)
    counts = torch.zeros(USERS)
    for d in draws:
        counts[d] += 1
    # Each user's inclusion count is Binomial(40, q = 0.5); a two-sided 1e-6 band each.
    low, high = stats.binom.ppf([FIT_ALPHA / 2, 1 - FIT_ALPHA / 2], 40, 0.5)
    assert bool(((counts >= low) & (counts <= high)).all()), counts


def test_train_run_on_a_grid_is_deployed_unless_a_seeded_rehearsal(data_dir, tmp_path):
    s = Setup(data_dir, tmp_path)  # seeded partitions, as SuperNodes with os-entropy=false
    metrics = train_run(s.config, tmp_path / "rehearsal", progress=False, grid=s.grid,
                        seeded_rehearsal=True)
    assert len(metrics["rounds"]) == 2
    with pytest.raises(PrivateRecError, match="a deployed server sent this round"):
        train_run(s.config, tmp_path / "deployed", progress=False, grid=s.grid)


def test_privacy_json_states_whose_randomness_the_epsilon_rests_on(data_dir, tmp_path):
    """A seeded run's privacy.json and report say its noise is seeded from config.yaml; a
    deployed one states the deployment's trust model; the distributed-noise text counts
    colluding clients against k and composes the epsilon against the server."""
    from privaterec.privacy.report import format_privacy_report, read_privacy_json
    from privaterec.runs.report import SIMULATION_TRUST

    s = Setup(data_dir, tmp_path, noise_placement="distributed")
    train_run(s.config, tmp_path / "rehearsal", progress=False, grid=s.grid,
              seeded_rehearsal=True)
    rehearsal = read_privacy_json(tmp_path / "rehearsal" / "privacy.json")
    assert rehearsal["release"]["mode"] == "simulation"
    assert rehearsal["release"]["trust"] == SIMULATION_TRUST
    assert f"Mode: {SIMULATION_TRUST}" in format_privacy_report(rehearsal)
    for context in s.grid.contexts.values():
        context.node_config["os-entropy"] = True  # as a real device would
    train_run(s.config, tmp_path / "deployed", progress=False, grid=s.grid)
    deployed = read_privacy_json(tmp_path / "deployed" / "privacy.json")
    assert deployed["release"]["mode"] == "deployed"
    assert "Mode: deployed (Flower)" in format_privacy_report(deployed)
    assert "the server process reads the training and test splits" in \
        deployed["release"]["trust"]
    trust = deployed["release"]["central"]["trust"]
    assert "dropouts + clients colluding with the server <= 0" in trust["noise"]
    against = trust["epsilon_against_the_server"]
    assert against["expected_participations"] == 1  # ceil(q T) = ceil(0.5 * 2)
    assert (against["per_participation"] == against["at_expected_participations"]
            < against["if_sampled_every_round"])


def test_the_nodes_source_follows_the_round_and_the_node():
    seeded = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                     run_config={})
    device = Context(run_id=1, node_id=2, node_config={"user-id": "U1"}, state=RecordDict(),
                     run_config={})
    assert client_app.secure_source(seeded, messages.seed_entry(7, False)) is None
    assert isinstance(client_app.secure_source(device, messages.seed_entry(7, False)), SecureNoise)
    assert isinstance(client_app.secure_source(device, messages.seed_entry(7, True)), SecureNoise)
    assert messages.seed_entry(7, True) == {"deployed": True}
    with pytest.raises(ConfigError, match="user-id"):
        client_app.secure_source(seeded, messages.seed_entry(7, True))
    opted_out = Context(run_id=1, node_id=3, node_config={"user-id": "U2", "os-entropy": False},
                        state=RecordDict(), run_config={})
    with pytest.raises(ConfigError, match="deployed server"):
        client_app.secure_source(opted_out, messages.seed_entry(7, True))


def test_the_server_sees_masked_vectors_only(data_dir, tmp_path):
    """What each client sends in the collect stage is its vector plus masks mod M: it
    differs from the client's plaintext integers, looks uniform mod M, and no reply of any
    stage carries the plaintext update."""
    s = Setup(data_dir, tmp_path)
    selected = s.selected(0)
    params = s.task.parameters()
    plan = s.method.secure_round(len(selected))
    assert plan is not None
    s.round_fn()(params, selected, 0)
    masked = _collect_replies(s.grid)
    assert len(masked) == len(selected)
    plain = {}
    for u in selected:
        update = s.method.update(s.task, params, s.method.inputs(
            s.task, s.clients.client(u), noise=client_noise(SEED, 0, u)),
            noise=client_noise(SEED, 0, u))[0]
        plain[u] = quantize([plan.quantize(update).numpy()], plan.clipping_range,
                            plan.quantization_range)[0]
    for reply in masked:
        u = reply.metadata.src_node_id - 1000
        arrays = [bytes_to_ndarray(b) for b in
                  reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        vector = arrays[1]  # arrays[0] is the (masked) weight
        assert vector.shape == plain[u].shape
        assert float(np.mean(vector == plain[u])) < 0.01  # masked, not the plaintext
        assert 0.45 < float(np.mean(vector)) / plan.modulus < 0.55  # uniform-looking mod M
        for record in reply.content.array_records.values():
            assert len(record) == 0  # the mod cleared the plaintext FitRes arrays
    for reply in s.grid.replies:  # nothing else from a client is an array
        assert all(len(r) == 0 for r in reply.content.array_records.values())


def secaggplus_mod_module() -> str:
    from flwr.client.mod import secaggplus_mod
    return secaggplus_mod.__module__


def test_secaggplus_masks_use_the_whole_seed():
    """Flower's own mask PRG folds a 256-bit seed into 32 bits (two seeds differing by the
    same XOR in two words give the same mask); the replacement uses every bit, is uniform
    mod M, and is what both of Flower's SecAgg+ modules call."""
    import importlib
    import sys
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    seed = bytes(range(32))
    twin = bytes([seed[0] ^ 1]) + seed[1:4] + bytes([seed[4] ^ 1]) + seed[5:]
    shapes, modulus = [(1,), (50_000,)], 2 ** 27
    assert all(np.array_equal(a, b) for a, b in zip(pseudo_rand_gen(seed, modulus, shapes),
                                                     pseudo_rand_gen(twin, modulus, shapes)))
    ours, other = flower.mask_prg(seed, modulus, shapes), flower.mask_prg(twin, modulus, shapes)
    assert [a.shape for a in ours] == shapes and ours[1].dtype == np.int64
    assert float(np.mean(ours[1] == other[1])) < 1e-3
    assert all(np.array_equal(a, b) for a, b in zip(ours, flower.mask_prg(seed, modulus,
                                                                          shapes)))
    counts = np.bincount(ours[1] >> 23, minlength=16)  # top 4 bits of 27: uniform
    assert ours[1].min() >= 0 and ours[1].max() < modulus
    assert stats.chisquare(counts).pvalue > FIT_ALPHA
    modules = [importlib.import_module(name) for name in secure.SECAGGPLUS_MODULES]
    assert [type(m).__name__ for m in modules] == ["module", "module"]
    assert modules[0] is sys.modules[secaggplus_mod_module()]
    # Importing privaterec patches nothing; the explicit call installs it in both modules,
    # and every entry point that runs SecAgg+ makes that call.
    saved = [m.pseudo_rand_gen for m in modules]
    try:
        for m in modules:
            m.pseudo_rand_gen = pseudo_rand_gen
        assert not secure.mask_prg_installed()
        client_app.make_client_app(lambda spec: None)  # type: ignore[arg-type,return-value]
        assert secure.mask_prg_installed()
        for m in modules:
            m.pseudo_rand_gen = pseudo_rand_gen
        flower.install_mask_prg()
        assert secure.mask_prg_installed()
    finally:
        for m, f in zip(modules, saved):
            m.pseudo_rand_gen = f
    flower.install_mask_prg()
    assert all(m.pseudo_rand_gen is flower.mask_prg for m in modules)
    assert "pseudo_rand_gen" in modules[0]._collect_masked_vectors.__code__.co_names


# =================================================================== configuration
def test_secure_aggregation_is_for_dp_fedavg_on_flower_only(data_dir, tmp_path):
    clients = prepare_data(_config(data_dir)).train_clients
    method = method_from_config(_config(data_dir))
    with pytest.raises(ConfigError, match="Flower engine only"):
        check_engine(method, clients, engine="simulator")
    plain = method_from_config(_config(data_dir, secure_aggregation="none"))
    with pytest.raises(ConfigError, match="--secure-aggregation secaggplus"):
        check_engine(plain, clients, engine="flower")
    check_engine(plain, clients, engine="simulator")  # the default path is unchanged
    with pytest.raises(ConfigError, match="need secure aggregation"):
        method_from_config(_config(data_dir, secure_aggregation="none",
                                   noise_placement="distributed"))
    with pytest.raises(ConfigError, match="does not apply to fedrec"):
        resolve_run_config(RunConfig(data="x", train=TrainConfig(method="fedrec"),
                                     fed=fed_config("fedrec", secure_aggregation="secaggplus")))
    with pytest.raises(ConfigError, match="at least 13 clients"):
        check_engine(method_from_config(_config(data_dir, max_dropouts=6)),
                     clients, engine="flower")
    with pytest.raises(ConfigError, match="secure_aggregation"):
        DPFedAvgSettings(noise_multiplier=1.0, secure_aggregation="secagg")
    with pytest.raises(ConfigError, match="adaptive clipping .* secure"):
        method_from_config(_config(data_dir, adaptive_clip_quantile=0.5))
    distributed = dc_replace(method, noise_placement="distributed")
    assert distributed.event_note() != method.event_note() != plain.event_note() == ""
    # privacy.json's release block states the trust model and the dropout assumption.
    kwargs = dict(dimension=600, parameters=["theta"], clients_per_round=6,
                  client_fraction=0.5)
    assert isinstance(central_dp_release(plain, **kwargs)["central"]["trust"], str)
    trust = central_dp_release(method, **kwargs)["central"]["trust"]
    assert trust["noise_placement"] == "central" and "honest-but-curious" in trust["threat_model"]
    trust = central_dp_release(distributed, **kwargs)["central"]["trust"]
    assert "dropouts + clients colluding with the server <= 0" in trust["noise"]
    assert "per participation" in trust["against_the_server"]
    assert trust["total_variation_per_coordinate_and_client"] < 1e-37


# ================================================================= end-to-end audit
@pytest.mark.parametrize("clip_space", ["parameters", "news_vectors"])
def test_audit_what_a_client_sends_under_secagg(data_dir, tmp_path, clip_space):
    """The end-to-end audit of the upload under SecAgg+: the same distinguisher as
    ``privaterec privacy audit`` (:func:`~privaterec.audit.distinguish`), on
    everything the server receives from one client in its collect stage, for two
    neighbouring users' data (one user's data replaced). Masked, the vector gives no lower
    bound above 0 (at α = 1e-6); the same client's plaintext vector is told apart at once
    (the audit has power). What a client sends in the four stages is listed and checked:
    two public keys, its encrypted secret shares, its masked vector (with its masked
    weight 1), the key shares for unmasking, and the constant ``num_examples = 1``. The
    same holds for a news-vector upload (``clip_space`` news_vectors: D_U + P·d
    coordinates)."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat
    from privaterec.audit import distinguish

    s = Setup(data_dir, tmp_path, clip_space=clip_space)
    params = s.task.parameters()
    plan = s.method.secure_round(2)
    assert plan is not None
    vectors = {}
    for u in range(3):  # users 0 and 1 are the neighbouring datasets of the audited client
        g = client_noise(SEED, 0, u)
        update = s.method.update(s.task, params, s.method.inputs(
            s.task, s.clients.client(u), noise=g), noise=g)[0]
        vectors[u] = plan.client_vector(update, g).numpy()
    assert vectors[0].shape == (s.method.release_dimension(s.task),)
    assert not np.array_equal(vectors[0], vectors[1])
    audited, others = 1000, (1001,)
    sent_by_audited: list[Message] = []

    def session(user: int) -> tuple[np.ndarray, np.ndarray]:
        content = {audited: vectors[user], others[0]: vectors[2]}

        def handler(message: Message, context: Context) -> Message:
            def fit(m: Message, c: Context) -> Message:
                fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(
                    [content[c.node_id]]), 1, {})
                return Message(compat.fitres_to_recorddict(fitres, False), reply_to=m)
            return secaggplus_mod(message, context, fit)

        grid = LocalGrid(handler, {n: {} for n in (audited, *others)})
        fitins = {n: FitIns(ndarrays_to_parameters([]), {})
                  for n in (audited, *others)}
        total, summed = flower.secure_sum(grid, plan, list(fitins), fitins, round_index=0,
                                          timeout=None)
        assert summed == 2
        assert np.allclose(total.numpy(), vectors[user] + vectors[2], rtol=0, atol=1e-12)
        mine = [r for r in grid.replies if r.metadata.src_node_id == audited]
        sent_by_audited.extend(mine)
        (masked,) = [r for r in _collect_replies(grid) if r.metadata.src_node_id == audited]
        arrays = [bytes_to_ndarray(b) for b in
                  masked.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        plain = quantize([vectors[user]], plan.clipping_range, plan.quantization_range)[0]
        return np.concatenate(arrays).astype(np.float64), plain.astype(np.float64)

    # Runs per side: learn, select, test; with 40 test runs any bound is at most 0.83 at
    # alpha = 1e-6 (bound_ceiling).
    sizes = (15, 15, 40)
    rows = {user: [session(user) for _ in range(sum(sizes))] for user in (0, 1)}

    def split(k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        bounds = np.cumsum((0,) + sizes)
        return [(np.stack([rows[0][i][k] for i in range(a, b)]),
                 np.stack([rows[1][i][k] for i in range(a, b)]))
                for a, b in zip(bounds[:-1], bounds[1:])]

    masked_sets, plain_sets = split(0), split(1)
    names = [f"masked[{i}]" for i in range(masked_sets[0][0].shape[1])]
    masked = distinguish(*masked_sets, names, alpha=1e-6)
    plain = distinguish(*plain_sets, names[1:], alpha=1e-6)
    assert masked.epsilon_lower_bound == 0.0
    assert plain.epsilon_lower_bound > 0.8  # the audit tells the plaintext apart
    # Everything the audited client sent, stage by stage.
    allowed = {RECORD_KEY_CONFIGS: {Key.PUBLIC_KEY_1, Key.PUBLIC_KEY_2, Key.DESTINATION_LIST,
                                    Key.CIPHERTEXT_LIST, Key.MASKED_PARAMETERS,
                                    Key.NODE_ID_LIST, Key.SHARE_LIST},
               "fitres.metrics": set(), "fitres.status": {"code", "message"}}
    for reply in sent_by_audited:
        for name, record in reply.content.config_records.items():
            assert set(record) <= allowed[name], (name, set(record))
        for name, record in reply.content.metric_records.items():
            assert (name, dict(record)) == ("fitres.num_examples", {"num_examples": 1})
        assert all(len(r) == 0 for r in reply.content.array_records.values())


def test_flwr_run_config_takes_the_secure_aggregation_keys(tmp_path):
    from privaterec.apps.flower_app import run_config_from_flower

    yaml = tmp_path / "run.yaml"
    RunConfig(model=TINY, train=TrainConfig(method="dp-fedavg", seed=7),
              fed=fed_config("dp-fedavg", noise_multiplier=1.0, target_delta=1e-4)).to_yaml(yaml)
    base = {"data-dir": str(tmp_path / "data"), "out-dir": str(tmp_path / "run"),
            "config": str(yaml), "method": "", "rounds": 0, "clients-per-round": 0,
            "seed": -1, "eval-every": -1, "drop-missing": False}
    config, _, _ = run_config_from_flower({**base, "secure-aggregation": "secaggplus",
                                           "noise-placement": "distributed",
                                           "max-dropouts": 2})
    settings = config.fed.settings
    assert (settings.secure_aggregation, settings.noise_placement,
            settings.max_dropouts) == ("secaggplus", "distributed", 2)
    config, _, _ = run_config_from_flower({**base, "secure-aggregation": "",
                                           "noise-placement": "", "max-dropouts": -1})
    assert (config.fed.settings.secure_aggregation, config.fed.settings.max_dropouts) == \
        ("none", 0)


def test_seeded_rehearsal_is_a_boolean_and_off_by_default():
    from privaterec.apps.flower_app import seeded_rehearsal

    assert seeded_rehearsal({}) is False
    assert seeded_rehearsal({"seeded-rehearsal": False}) is False
    assert seeded_rehearsal({"seeded-rehearsal": True}) is True
    for wrong in ("false", "true", 0, 1):  # a quoted 'false' must not seed a deployment
        with pytest.raises(ConfigError, match="seeded-rehearsal"):
            seeded_rehearsal({"seeded-rehearsal": wrong})
