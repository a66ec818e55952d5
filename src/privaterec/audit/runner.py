"""Play the distinguishing game on a client's real upload and compare with its claim.

For a neighbouring pair (D, D′) the client's upload is run ``runs`` times on each, every
run with a fresh noise source (seeded from (seed, pair, side, run)); everything the server
receives is flattened into one row of numbers (:func:`flatten_sent`); the distinguisher of
:mod:`~privaterec.audit.distinguisher` gives a 95% lower bound ε_lb, and the
claim is what the client's privacy events state for the pair's adjacency
(:func:`claimed_budget`). ε_lb > claimed ε means the client's privacy claim is false.
"""

from __future__ import annotations

import math
import numbers
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from privaterec.errors import ConfigError
from privaterec.privacy.events import Adjacency
from privaterec.privacy.samplers import SimulationNoise
from privaterec.audit.distinguisher import DistinguisherResult, distinguish
from privaterec.audit.targets import Release, Target, Upload, make_target
from privaterec.audit.world import (AuditWorld, NeighbourPair, make_world,
                                                neighbour_pairs)

DEFAULT_RUNS = 1000


@dataclass(frozen=True)
class Claim:
    """The budget a client's events state for one upload under one adjacency.

    epsilon, delta: basic composition (sums) of the events' adjacency-specific (ε, δ);
    valid: False when an event is marked invalid (the library warns that its guarantee does
    not hold); source: where the per-event ε came from.
    """

    epsilon: float
    delta: float
    valid: bool
    source: str


def claimed_budget(events: Iterable[Any], adjacency: Adjacency) -> Claim:
    """The (ε, δ) the events claim for one upload under ``adjacency`` (basic composition).

    The claim is the largest sum of the events' (ε, δ) over the groups a single neighbour
    can change (:func:`~privaterec.privacy.ledger.adjacency_view`: under ``"user"`` one
    group of every event at its user-level guarantee; under ``"click"`` one group per part
    of the data the events read).
    """
    from privaterec.privacy.ledger import adjacency_view

    events = list(events)
    best = (0.0, 0.0)
    for group in adjacency_view([(e, 1) for e in events], adjacency):
        best = max(best, (sum(float(e.epsilon) for e, _ in group),
                          sum(float(e.delta) for e, _ in group)))
    valid = all(bool(getattr(e, "valid", True)) for e in events)
    source = "ledger adjacency_view: max over data parts of the sum" if events else "no event"
    return Claim(best[0], min(best[1], 1.0), valid, source)


def _flatten(prefix: str, value: Any, out_names: list[str], out_values: list[np.ndarray],
             categories: dict[str, dict[Any, int]]) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1).to(torch.float64).cpu().numpy()
        out_values.append(flat)
        out_names.extend(f"{prefix}[{i}]" if flat.size > 1 else prefix
                         for i in range(flat.size))
    elif isinstance(value, np.ndarray):
        _flatten(prefix, torch.from_numpy(np.asarray(value, dtype=np.float64)), out_names,
                 out_values, categories)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _flatten(f"{prefix}.{key}" if prefix else str(key), value[key], out_names,
                     out_values, categories)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Real) or
                                                  isinstance(v, torch.Tensor) for v in value):
        for i, v in enumerate(value):
            _flatten(f"{prefix}[{i}]", v, out_names, out_values, categories)
    elif isinstance(value, numbers.Real):
        out_values.append(np.array([float(value)]))
        out_names.append(prefix)
    else:  # strings, None, nested objects: one categorical code per distinct value
        codes = categories.setdefault(prefix, {})
        key = repr(value)
        out_values.append(np.array([float(codes.setdefault(key, len(codes)))]))
        out_names.append(prefix)


def flatten_sent(sent: Mapping[str, Any], categories: dict[str, dict[Any, int]] | None = None
                 ) -> tuple[list[str], np.ndarray]:
    """(column names, float64 values) of everything in ``sent`` (tensors flattened; numbers
    as one column; any other value as a categorical code shared through ``categories``)."""
    names: list[str] = []
    values: list[np.ndarray] = []
    _flatten("", sent, names, values, {} if categories is None else categories)
    return names, (np.concatenate(values) if values else np.zeros(0))


def _noise(*key: int) -> SimulationNoise:
    """A fresh simulation source per run, seeded from ``key`` = (seed, pair, part, side, run)."""
    state = np.random.SeedSequence(list(key)).generate_state(2, np.uint32)
    return SimulationNoise(torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1])))


@contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: extra threads only spin on shared cores
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class PairAudit:
    """The audit of one neighbouring pair: claim, distinguisher result, verdict."""

    method: str
    mode: str
    adjacency: str
    pair: str
    description: str
    claimed_epsilon: float
    claimed_delta: float
    claim_valid: bool
    claim_source: str
    runs: int
    result: DistinguisherResult

    @property
    def epsilon_lower_bound(self) -> float:
        return self.result.epsilon_lower_bound

    @property
    def violated(self) -> bool:
        """A valid claim that the lower bound exceeds (the implementation is broken)."""
        return self.claim_valid and self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def verdict(self) -> str:
        if not self.claim_valid:
            return "INVALID CLAIM (library warns)"
        if self.violated:
            return "FAIL (lower bound > claim)"
        if math.isinf(self.claimed_epsilon):
            return "pass (no finite claim)"
        if self.result.ceiling <= self.claimed_epsilon:
            return "pass (claim above ceiling)"
        return "pass"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "result"}
        out.update(result=asdict(self.result), epsilon_lower_bound=self.epsilon_lower_bound,
                   violated=self.violated, verdict=self.verdict)
        return out


LEARN, SELECT, TEST = 0, 1, 2


def _collect(upload: Upload, data: Any, keys: Sequence[tuple[int, ...]],
             categories: dict[str, dict[Any, int]]) -> tuple[list[str], np.ndarray,
                                                             list[Release]]:
    """Run ``upload`` once per seed key; (column names, ``[runs, p]``, releases)."""
    names: list[str] | None = None
    rows, releases = [], []
    for key in keys:
        release = upload(data, _noise(*key))
        row_names, row = flatten_sent(release.sent, categories)
        if names is None:
            names = row_names
        elif row_names != names:
            raise ConfigError(f"the upload's fields changed between runs: {names[:4]}... vs "
                              f"{row_names[:4]}...; the audit needs a fixed layout")
        rows.append(row)
        releases.append(release)
    assert names is not None
    return names, np.stack(rows), releases


def _align(blocks: Sequence[tuple[list[str], np.ndarray]]) -> tuple[list[str], list[np.ndarray]]:
    """Put blocks with different columns on the union of their columns; a column a block
    lacks is 0 there, and a ``has <column>`` indicator column tells the two apart."""
    if all(names == blocks[0][0] for names, _ in blocks):
        return blocks[0][0], [x for _, x in blocks]
    union = list(dict.fromkeys(n for names, _ in blocks for n in names))
    out = []
    for names, x in blocks:
        index = {n: i for i, n in enumerate(names)}
        full = np.zeros((x.shape[0], 2 * len(union)))
        for j, n in enumerate(union):
            if n in index:
                full[:, j] = x[:, index[n]]
                full[:, len(union) + j] = 1.0
        out.append(full)
    return union + [f"has {n}" for n in union], out


def _metadata_columns(names: Sequence[str]) -> list[int]:
    return [j for j, n in enumerate(names) if not n.startswith("payload")]


def _pair_key(pair: NeighbourPair) -> int:
    """A stable integer naming the pair (distinct pairs: distinct generator streams)."""
    return zlib.crc32(f"{pair.adjacency}:{pair.name}".encode())


def audit_pair(upload: Upload, pair: NeighbourPair, *, method: str = "", mode: str = "-",
               runs: int = DEFAULT_RUNS, seed: int = 0, alpha: float = 0.05) -> PairAudit:
    """Play the game on one neighbouring pair (module docstring).

    Of the ``runs`` uploads per dataset, a quarter are *learn* runs paired across D and D′
    (the same seed on both: the distinguisher's statistics are fitted on them), a
    quarter *select* runs and the rest *test* runs, each with its own fresh seed; only
    the test runs enter the bound
    (:func:`~privaterec.audit.distinguisher.distinguish`).

    Parameters
    ----------
    upload:
        ``upload(data, noise) -> Release``, the client's whole upload of one round.
    pair:
        The neighbouring datasets and their adjacency.
    method, mode:
        Labels for the table.
    runs:
        Uploads per dataset (≥ 16).
    seed:
        Seeds every run's noise source (with the pair, the part and the run index).
    alpha:
        The bound holds with probability ≥ 1 − α.
    """
    if not (isinstance(runs, int) and runs >= 16):
        raise ConfigError(f"invalid audit parameter 'runs': got {runs!r}, expected an int >= 16")
    quarter = runs // 4
    counts = {LEARN: quarter, SELECT: quarter, TEST: runs - 2 * quarter}
    key = _pair_key(pair)
    categories: dict[str, dict[Any, int]] = {}
    blocks, releases = [], []
    with _one_thread():
        for part in (LEARN, SELECT, TEST):
            for side, data in ((0, pair.d0), (1, pair.d1)):
                # learn runs: the same keys on both sides (paired); others: independent
                keys = [(seed, key, part, 0 if part == LEARN else side, run)
                        for run in range(counts[part])]
                names, x, rel = _collect(upload, data, keys, categories)
                blocks.append((names, x))
                releases += rel
    names, xs = _align(blocks)
    claims = [claimed_budget(r.events, pair.adjacency) for r in releases]
    worst = max(claims, key=lambda c: (c.epsilon, c.delta))
    valid = all(c.valid for c in claims)
    result = distinguish((xs[0], xs[1]), (xs[2], xs[3]), (xs[4], xs[5]), names,
                         metadata=_metadata_columns(names), paired=True, alpha=alpha,
                         delta=worst.delta)
    return PairAudit(method=method, mode=mode, adjacency=pair.adjacency, pair=pair.name,
                     description=pair.description, claimed_epsilon=worst.epsilon,
                     claimed_delta=worst.delta, claim_valid=valid,
                     claim_source=worst.source, runs=runs, result=result)


def audit_target(target: Target, pairs: Sequence[NeighbourPair], *, runs: int = DEFAULT_RUNS,
                 seed: int = 0, alpha: float = 0.05) -> list[PairAudit]:
    """:func:`audit_pair` of ``target`` on each pair."""
    return [audit_pair(target.upload, pair, method=target.method, mode=target.mode,
                       runs=runs, seed=seed, alpha=alpha) for pair in pairs]


def run_audit(method: str, *, adjacency: str, epsilon: float, mode: str = "strict",
              runs: int = DEFAULT_RUNS, seed: int = 0, alpha: float = 0.05,
              noise: str = "laplace", world: AuditWorld | None = None) -> list[PairAudit]:
    """The end-to-end audit of ``method``'s real client update under ``adjacency``.

    Parameters
    ----------
    method:
        ``fedrec``, ``fednewsrec``, ``dp-fedrec``, ``privaterec``, ``unifedrec``, or
        ``dp-fedavg`` / ``dp-fedavg-adaptive`` / ``dp-fedavg-news`` (central DP: what the
        aggregator releases from the user's upload in one round at q = 1; ``news``: clipped
        in news-vector space).
    adjacency:
        ``click`` or ``user`` (:mod:`~privaterec.audit.world`).
    epsilon:
        The per-round budget the method is configured with (FedNewsRec: λ = 2δD/ε;
        Uni-FedRec: λ_g = 2θ/ε; FedRec has no noise and claims ε = ∞; DP-FedAvg: the
        round's ε at q = 1).
    mode:
        PrivateRec's ``paper`` or ``strict`` (ignored by the other methods).
    runs, seed, alpha:
        As in :func:`audit_pair`.
    noise:
        ``laplace`` or ``gaussian`` (DP-FedRec, PrivateRec).

    Returns
    -------
    One :class:`PairAudit` per neighbouring pair of the adjacency.
    """
    world = make_world() if world is None else world
    pairs = neighbour_pairs(world, adjacency)
    target = make_target(method, world, mode=mode, epsilon=epsilon, noise=noise)
    return audit_target(target, pairs, runs=runs, seed=seed, alpha=alpha)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def format_table(audits: Sequence[PairAudit]) -> str:
    """A markdown table: method, mode, adjacency, claimed ε, ε_lb, ceiling, runs, test,
    verdict."""
    lines = ["| method | mode | adjacency | claimed ε | empirical ε lower bound (95%) | "
             "ceiling | runs | test | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a in audits:
        claim = _fmt(a.claimed_epsilon) + ("" if a.claim_valid else " (invalid)")
        r = a.result
        test = (f"{r.statistic}; FPR {r.false_positive_rate:.3f}, "
                f"FNR {r.false_negative_rate:.3f}")
        lines.append(f"| {a.method} | {a.mode} | {a.adjacency}: {a.pair} | {claim} | "
                     f"{r.epsilon_lower_bound:.3f} | {r.ceiling:.2f} | {a.runs} | {test} | "
                     f"{a.verdict} |")
    return "\n".join(lines)


__all__ = ["Claim", "DEFAULT_RUNS", "PairAudit", "audit_pair", "audit_target",
           "claimed_budget", "flatten_sent", "format_table", "run_audit"]
