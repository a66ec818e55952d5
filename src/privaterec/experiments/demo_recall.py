"""The demo's Uni-FedRec part: train the recall model on the demo's FedRec ranker, show one
private query (what the device sends, what the server recalls) and the recall metrics of
every test user against YoutubeNet (Uni-FedRec §3.4, §4).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privaterec.experiments.demo_summary import RecallRow, format_recall_table
from privaterec.experiments.unifedrec import UNIFEDREC
from privaterec.privacy.samplers import SimulationNoise
from privaterec.recall.evaluate import query_generator, recall_users
from privaterec.recall.index import ScoreSpaceIndex
from privaterec.recall.query import release_query
from privaterec.runs.recall import (RecallRunConfig, evaluate_recall_run, load_ranker_news,
                                   load_recall_run, query_bytes, train_recall_run)

DEMO_RECALL_ROUNDS = 300
QUICK_RECALL_ROUNDS = 10
DEMO_RECALL_CLIENTS = 40
DEMO_RECALL_SIZE = 100  # R of the shown query


def demo_recall_config(ranker: Path, *, quick: bool) -> RecallRunConfig:
    """The demo's recall model: the experiment's LDP training at a smaller budget."""
    config = UNIFEDREC.run_config(ranker, seed=0, quick=quick)
    fed = dataclasses.replace(config.fed, rounds=QUICK_RECALL_ROUNDS if quick else
                              DEMO_RECALL_ROUNDS, clients_per_round=DEMO_RECALL_CLIENTS)
    return dataclasses.replace(config, fed=fed)


@dataclass(frozen=True)
class RecallDemo:
    """The demo's recall part: its text (``text``) and table rows (recall ×100)."""

    text: str
    rows: tuple[RecallRow, ...]
    pool: int
    users: int


def run_recall_demo(root: Path, ranker: Path, *, quick: bool, progress: bool) -> RecallDemo:
    """Train, query and evaluate; returns the demo's markdown of the recall part and its rows."""
    out = root / "runs" / "unifedrec-recall"
    shutil.rmtree(out, ignore_errors=True)
    print("training unifedrec recall model ...", file=sys.stderr)
    train_recall_run(demo_recall_config(ranker, quick=quick), out, progress=progress)
    lines = ["", "Uni-FedRec private recall (recall model on the fedrec / nrms ranker):", "",
             _one_query(out), ""]
    results = {m: evaluate_recall_run(out, method=m, progress=False, record=m == "unifedrec")
               for m in ("unifedrec", "youtubenet")}
    rows = []
    for method, r in results.items():
        eps = r["query_epsilon_max"]
        eps_text = ("∞ (user vector sent in the clear)" if eps == float("inf")
                    else f"≤ {eps:g}") + (
            " + quotas sent unprotected" if r["quotas_in_clear"] else "")
        rows.append(RecallRow(name=method, future100=100 * r["future_recall@100"],
                              future400=100 * r["future_recall@400"],
                              history100=100 * r["history_recall@100"], auc=r["auc"],
                              epsilon=eps_text, bytes_per_query=round(r["bytes_per_query"])))
    lines.append(format_recall_table(rows))
    lines.append(f"\nUni-FedRec queries (simulated) are recorded in "
                 f"{results['unifedrec'].get('record', out)}. Its ε composes "
                 f"C channels of 2δB/λ_I; its quotas (each channel's share of the history) go "
                 f"in the clear as in the paper (no guarantee; `evaluate --recall unifedrec "
                 f"--quota-noise L` hides them).")
    first = results["unifedrec"]
    return RecallDemo("\n".join(lines), tuple(rows), int(first["pool_size"]),
                      int(first["users"]))


def _one_query(run_dir: Path) -> str:
    """One test user's query: channels, quotas, bytes, and the first recalled titles."""
    run = load_recall_run(run_dir)
    from privaterec.data.mind import load_dataset

    dataset = load_dataset(run.config.data)
    ranker = load_ranker_news(run.ranker, dataset.all_news())
    assert dataset.test is not None
    users = recall_users(dataset.test, ranker.features, history_len=ranker.history_len)
    history, mask = users.history[:1], users.history_mask[:1]
    query = release_query(run.model, ranker.vectors[history], mask,
                          noise=SimulationNoise(query_generator(0, 0)))
    released = query.released[0]
    alpha = query.alpha[0][released]
    quotas = query.quotas[0][released]
    index = ScoreSpaceIndex(run.model.interest.values.detach(), ranker.vectors[1:])
    recalled = index.recall(alpha.double().numpy(), quotas.double().numpy(),
                            DEMO_RECALL_SIZE) + 1  # pool = table rows 1..N-1
    ids = list(dataset.all_news())
    titles = [dataset.all_news()[ids[int(r) - 1]].title for r in recalled[:3]]
    hits = len(set(int(r) for r in recalled) & set(users.future[0].tolist()))
    channels = int(released.sum())
    shown: list[Any] = [round(float(x), 3) for x in alpha[0][:5]]
    return (f"- user {users.user_ids[0]} ({int(mask.sum())} clicks in its history): "
            f"{channels} interest channel(s); sent {channels} × {run.model.num_basis} channel "
            f"weights (first: {shown}…) + quotas {[round(float(q), 3) for q in quotas]} = "
            f"{query_bytes('unifedrec', channels=channels, num_basis=run.model.num_basis, dim=0):.0f}"
            f" bytes.\n- server recalled {DEMO_RECALL_SIZE} news in the B-dim score space, "
            f"{hits} of the user's {len(users.future[0])} test clicks among them; first: "
            f"{titles}")
