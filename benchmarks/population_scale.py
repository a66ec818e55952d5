"""The simulator's per-round work outside the model at a million users (docs/gpu.md).

Usage::

    python benchmarks/population_scale.py

A ``ClientDataset`` of 1,000,000 users built directly as tensors (histories of 50 rows,
3 samples of 8 non-clicked candidates per user; no MIND files), then what every round does
on the CPU whatever the device: sampling 10,000 clients (``sample_round``) or q = 0.01
(``poisson_round``), drawing the 10,000 clients' inputs (``clients.client(u)`` and each
client's seeded generator, the ranking task's ``client_inputs``), and central DP's ledger
update of every user (``PrivacyLedger.record_many``). Prints seconds and peak RSS.
"""
import resource, time, torch
from privaterec.data.clients import ClientDataset
from privaterec.fed.sampling import roster, sample_round, poisson_round
from privaterec.fed.methods.ranking import FedRec
from privaterec.fed.rng import client_generator
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.privacy.events import PrivacyEvent
U, H, S_PER, M = 1_000_000, 50, 3, 8
g = torch.Generator().manual_seed(0)
t = time.perf_counter()
S = U * S_PER
ds = ClientDataset(user_ids=[f"U{i}" for i in range(U)],
                   history=torch.randint(1, 160_000, (U, H), generator=g),
                   history_mask=torch.ones(U, H, dtype=torch.bool),
                   sample_user=torch.arange(U).repeat_interleave(S_PER),
                   positives=torch.randint(1, 160_000, (S,), generator=g),
                   negatives=torch.randint(1, 160_000, (S, M), generator=g),
                   negative_counts=torch.full((S,), M), impression_size=torch.full((S,), M + 1),
                   offsets=torch.arange(0, S + 1, S_PER), skipped={})
print(f"dataset {time.perf_counter()-t:.1f} s, maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MB")
pop = roster(ds)
t = time.perf_counter(); sel = sample_round(pop, 10_000, seed=0, round_index=1); a = time.perf_counter() - t
t = time.perf_counter(); sel2 = poisson_round(pop, 0.01, seed=0, round_index=1); b = time.perf_counter() - t
print(f"sample_round 10k of 1M: {a:.3f} s; poisson_round q=0.01: {b:.3f} s ({len(sel2)} clients)")
method = FedRec(negatives=4, max_samples=64)
class T:  # the ranking task's client_inputs without a model
    from privaterec.fed.objective import LocalObjective
    client_inputs = LocalObjective.client_inputs
t = time.perf_counter()
inputs = [T.client_inputs(None, ds.client(u), max_samples=64, negatives=4,
                          generator=client_generator(0, 1, u)) for u in sel]
c = time.perf_counter() - t
print(f"inputs of 10,000 clients: {c:.2f} s ({1e3*c/len(sel):.2f} ms per client)")
ledger = PrivacyLedger()
ids = [ds.user_ids[int(u)] for u in pop]
ev = PrivacyEvent(mechanism="gaussian", epsilon=0.1, delta=1e-9, phase="train", note="probe", noise_scale=1.0, sensitivity=1.0)
t = time.perf_counter(); ledger.record_many(ids, ev); d1 = time.perf_counter() - t
t = time.perf_counter(); ledger.record_many(ids, ev); d2 = time.perf_counter() - t
print(f"ledger.record_many of 1M users: first {d1:.2f} s, next round {d2:.2f} s")
print(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MB")
