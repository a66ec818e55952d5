"""The demo's closing lines: what its tables mean, computed from the numbers they print.

The demo prints a ranking table (test AUC and privacy budgets per method), a recall table
(Uni-FedRec against YoutubeNet) and footnotes holding the facts the conclusion needs (the
chance band of AUC, the noise of each noised upload relative to its clip bound, the recall
pool). :func:`demo_conclusion` turns those into a few sentences, and
:func:`parse_demo_output` reads them back from the printed text, so a test can check that
any copy of the output (docs/demo.md's) is consistent number for number.

Definitions used everywhere in the demo and its docs:

* **bytes per query**: the float32 values a device sends for one query, 4 bytes each
  (PrivateRec: B floats; VDP and YoutubeNet: d floats; Uni-FedRec: C·(B + 1)). Over HTTP
  the JSON request body is larger; the demo labels that number separately.
* **recall**: ×100 (the percentage of a user's clicks found among the K recalled news);
  picking K news of the pool at random finds K / pool of them (the chance level).
* **ε = ∞**: no formal guarantee (centralized and popularity collect the clicks; fedrec
  uploads raw gradients). Every method has an ε; none is left blank.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

CHANCE_AUC = 0.5
CHANCE_BAND_SE = 2.0  # half-width of the chance band, in standard errors

MAIN_HEADER = ("| method | test AUC | MRR | nDCG@5 | nDCG@10 | ε_t per round | ε_s per query "
               "| bytes per query | ε per user (max), click-level | ε per user (max), user-level "
               "| seconds |")
LEGACY_MAIN_HEADER = ("| method | test AUC | MRR | nDCG@5 | nDCG@10 | ε_t per round | ε_s per "
                      "query | bytes per query | ε per user (max) | seconds |")
"""The ranking table of earlier demo outputs: one ε per user column, of mixed adjacencies
(click-level where the method has it, else user-level). Still read by
:func:`parse_demo_output`; its rows have no ``epsilon_user_level``."""
RECALL_HEADER = ("| recall | future clicks found in 100 (%) | future clicks found in 400 (%) "
                 "| history clicks found in 100 (%, leakage) | AUC ranking the 400 found "
                 "| ε per query | bytes per query |")


@dataclass(frozen=True)
class DemoRow:
    """One row of the demo's ranking table.

    ``epsilon_query`` and ``bytes_per_query`` are ``None`` for rows without private serving.
    ``epsilon_user`` is the ledger's per-user total at click-level adjacency (one click of a
    user changes) and ``epsilon_user_level`` at user-level adjacency (all of one user's data
    replaced; ∞ where the method bounds only a click; docs/privacy.md#what-each-ε-protects).
    A serving row's totals are its run's training plus that one evaluation's queries.
    """

    name: str
    auc: float
    mrr: float
    ndcg5: float
    ndcg10: float
    epsilon_round: float
    epsilon_query: float | None
    bytes_per_query: int | None
    epsilon_user: float
    paper_mode: bool = False
    seconds: float = 0.0
    epsilon_user_level: float | None = None


@dataclass(frozen=True)
class RecallRow:
    """One row of the demo's recall table (recall values ×100)."""

    name: str
    future100: float
    future400: float
    history100: float
    auc: float
    epsilon: str
    bytes_per_query: int


@dataclass(frozen=True)
class DemoFacts:
    """What the conclusion needs beyond the two tables.

    Attributes
    ----------
    impressions: test impressions with both a click and a non-click (those AUC averages).
    chance_se: standard error of the mean AUC of random scores over those impressions.
    noise_ratio: per noised row, E‖noise‖₁ of one upload divided by the largest ‖update‖₁
        its clipping allows (D·b/θ for L1 clipping, b/δ for element-wise clipping).
    central_noise_ratio: per central-DP row, E‖noise‖₂ added to a round's sum divided by
        the largest ‖sum‖₂ of its m clipped updates (σ√D / (m·C)).
    clients_per_round: m, the clients whose uploads one round averages (for central DP, the
        expected number qN).
    recall_pool: news the recall queries search; recall_users: users queried.
    runs: where the demo saved its runs (``~`` for the home directory).
    """

    impressions: int
    chance_se: float
    noise_ratio: Mapping[str, float] = field(default_factory=dict)
    central_noise_ratio: Mapping[str, float] = field(default_factory=dict)
    clients_per_round: int = 0
    recall_pool: int = 0
    recall_users: int = 0
    runs: str = ""

    @property
    def band(self) -> tuple[float, float]:
        """The chance band of AUC: 0.5 ± 2 standard errors."""
        half = CHANCE_BAND_SE * self.chance_se
        return CHANCE_AUC - half, CHANCE_AUC + half

    def chance_recall(self, k: int) -> float:
        """Recall ×100 of K news picked at random from the pool."""
        return 100.0 * k / self.recall_pool if self.recall_pool else math.nan


def chance_auc_se(impressions: Iterable[Sequence[int]]) -> tuple[int, float]:
    """Standard error of the mean per-impression AUC of random scores.

    For one impression with n₁ clicked and n₀ non-clicked candidates, the AUC of random
    (continuous, i.i.d.) scores is the Mann-Whitney U/(n₀n₁), with mean 1/2 and variance
    (n₀ + n₁ + 1)/(12 n₀ n₁). Impressions are independent, so the mean over the n
    impressions that have both classes has variance Σ varᵢ / n².

    Parameters
    ----------
    impressions:
        The 0/1 labels of each impression's candidates.

    Returns
    -------
    (n, se)
        The number of impressions with both classes and the standard error.
    """
    count, variance = 0, 0.0
    for labels in impressions:
        n1 = sum(1 for y in labels if y)
        n0 = len(labels) - n1
        if n1 and n0:
            count += 1
            variance += (n0 + n1 + 1) / (12.0 * n0 * n1)
    return count, (math.sqrt(variance) / count if count else math.nan)


# ------------------------------------------------------------------------------ format
def fmt_eps(value: float | None) -> str:
    """An ε as the demo prints it: ∞ for no guarantee, 3 significant digits otherwise."""
    if value is None or math.isinf(value):
        return "∞"
    return f"{value:,.3g}" if value < 1e4 else f"{value:,.0f}"


MAIN_SEPARATOR = "|---|---|---|---|---|---|---|---|---|---|---|"


def format_main_row(r: DemoRow) -> str:
    """One line of the demo's ranking table (:data:`MAIN_HEADER`)."""
    return (f"| {r.name} | {r.auc:.4f} | {r.mrr:.4f} | {r.ndcg5:.4f} | {r.ndcg10:.4f} | "
            f"{fmt_eps(r.epsilon_round)} | "
            f"{'–' if r.epsilon_query is None else fmt_eps(r.epsilon_query)} | "
            f"{'–' if r.bytes_per_query is None else r.bytes_per_query} | "
            f"{fmt_eps(r.epsilon_user)}{' †' if r.paper_mode else ''} | "
            f"{fmt_eps(r.epsilon_user_level)} | {r.seconds:.0f} |")


def format_main_table(rows: Sequence[DemoRow]) -> str:
    return "\n".join([MAIN_HEADER, MAIN_SEPARATOR] + [format_main_row(r) for r in rows])


def format_main_footnotes(facts: DemoFacts, *, delta: float | None) -> str:
    low, high = facts.band
    noise = "; ".join(f"{name} {ratio:,.0f}×" for name, ratio in facts.noise_ratio.items())
    lines = [
        f"- {facts.impressions} test impressions with a click and a non-click. Random scores "
        f"give AUC 0.5 with a standard error of {facts.chance_se:.4f} over them: the chance "
        f"band is {low:.3f}–{high:.3f} (±{CHANCE_BAND_SE:g} standard errors).",
        "- bytes per query: the float32 values a device sends for one query, 4 bytes each "
        "(PrivateRec: B = 5 attention weights; VDP: the d = 128 user vector). '–': no "
        "private serving.",
        f"- Noise of one upload, as a multiple of the largest update its clipping allows (L1 "
        f"norms; {facts.clients_per_round} clients per round): {noise or 'none'}.",
        *([f"- Central DP ({', '.join(facts.central_noise_ratio)}): the server adds Gaussian "
           f"noise once to the sum of a round's clipped updates; that noise, as a multiple of "
           f"the largest sum they can have (L2 norms; {facts.clients_per_round} expected "
           f"clients per round): "
           + "; ".join(f"{name} {ratio:,.0f}×" for name, ratio in
                       facts.central_noise_ratio.items())
           + ". Its ε_t is one round of that release, for every user, sampled or not; its ε "
             "per user is the whole run's, for one user's data replaced. The server sees each "
             "clipped update (a trusted aggregator)."] if facts.central_noise_ratio else []),
        f"- ε_t: one client's upload in one round; ε_s: one query; ε per user: the privacy "
        f"ledger's total over all of a user's rounds and queries (PLD composition"
        f"{f' at δ = {delta:g}' if delta else ''}), at two adjacencies: click-level (one "
        f"click of the user changes) and user-level (all of the user's data replaced; "
        f"compare methods in this column). A serving row adds that evaluation's queries to "
        f"its run's training, and local ranking adds none (ε_s = 0). ∞: no formal guarantee. "
        f"fednewsrec's ε "
        f"is for the whole update (2δD/λ), not per coordinate. †: PrivateRec paper mode "
        f"(Alg. 3 as published): ε covers α̃ and the labels, NOT the uploaded gradient's "
        f"history path (`privaterec privacy report --run RUN` names the parameters).",
    ]
    return "\n".join(lines)


def format_recall_table(rows: Sequence[RecallRow]) -> str:
    lines = [RECALL_HEADER, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.future100:.2f} | {r.future400:.2f} | "
                     f"{r.history100:.2f} | {r.auc:.4f} | {r.epsilon} | {r.bytes_per_query} |")
    return "\n".join(lines)


def format_recall_footnote(facts: DemoFacts) -> str:
    return (f"- {facts.recall_users} test users, one query each, over a pool of "
            f"{facts.recall_pool} news. Found (%): the share of the user's clicks among the K "
            f"news the server recalled; K news picked at random find {facts.chance_recall(100):.2f}"
            f"% (K = 100) and {facts.chance_recall(400):.2f}% (K = 400). Future clicks: the "
            f"test day's clicks (utility); history clicks: the clicks the query was computed "
            f"from (what the query leaks). AUC ranking the 400 found: how well the device's "
            f"ranker orders the 400 recalled news.")


# -------------------------------------------------------------------------- conclusion
def _names(rows: Sequence[DemoRow]) -> str:
    return ", ".join(f"{r.name} {r.auc:.4f}" for r in rows)


def demo_conclusion(rows: Sequence[DemoRow], recall: Sequence[RecallRow],
                    facts: DemoFacts) -> list[str]:
    """The demo's closing lines, computed from its tables and footnotes.

    Rows are sorted by where their test AUC lies relative to the chance band
    0.5 ± 2 SE (:func:`chance_auc_se`); the reasons given come from the rows' budgets and
    from ``facts.noise_ratio``.
    """
    # compute from the numbers as printed, so a copy of the output gives the same lines
    rows = [dataclasses.replace(r, auc=round(r.auc, 4)) for r in rows]
    recall = [dataclasses.replace(r, future100=round(r.future100, 2),
                                  future400=round(r.future400, 2),
                                  history100=round(r.history100, 2)) for r in recall]
    facts = dataclasses.replace(facts, chance_se=round(facts.chance_se, 4))
    low, high = facts.band
    trained = [r for r in rows if "→" not in r.name]
    served = [r for r in rows if "→" in r.name]
    learn = [r for r in trained if r.auc > high]
    near = [r for r in trained if low <= r.auc <= high]
    below = [r for r in trained if r.auc < low]
    lines = ["What this shows:"]
    if learn:
        lines.append(f"- Learn (test AUC above the chance band {low:.3f}–{high:.3f}): "
                     f"{_names(learn)}."
                     + (" (popularity ranks by click counts alone: no personalisation.)"
                        if any(r.name == "popularity" for r in learn) else ""))
    plain = [r for r in learn if math.isinf(r.epsilon_round) and r.name != "popularity"]
    if len(plain) > 1:
        best, worst = max(plain, key=lambda r: r.auc), min(plain, key=lambda r: r.auc)
        lines.append(f"  Without noise, federated and centralized training agree within "
                     f"{best.auc - worst.auc:.4f} AUC ({worst.name} to {best.name}); none of "
                     f"them has a guarantee (ε = ∞).")
    private_learn = [r for r in learn if not math.isinf(r.epsilon_round)]
    for r in private_learn:
        stuck = [n.name for n in near if n.epsilon_round == r.epsilon_round]
        why = (" Its ε covers only the noised attention weights α̃ and the labels (†); the "
               "rest of its upload is not noised"
               + (f", which is why it learns where {' and '.join(stuck)} does not"
                  if stuck else "") + "." if r.paper_mode else "")
        ratio = facts.noise_ratio.get(r.name)
        noise = (f" Its noise is {ratio:,.0f}× the clipped update, averaged over "
                 f"{facts.clients_per_round} clients per round." if ratio is not None else "")
        if r.name in facts.central_noise_ratio:
            lines.append(f"  {r.name} learns at ε = {fmt_eps(r.epsilon_user)} per user for the "
                         f"whole run (central DP: the noise on a round's sum is "
                         f"{facts.central_noise_ratio[r.name]:,.0f}× the largest sum of its "
                         f"clipped updates).")
            continue
        lines.append(f"  {r.name} learns at ε_t = {fmt_eps(r.epsilon_round)} per round "
                     f"(ε per user {fmt_eps(r.epsilon_user)}).{noise}{why}")
    if near:
        lines.append(f"- Near chance (inside the band): {_names(near)}.")
        for r in near:
            ratio = facts.noise_ratio.get(r.name)
            if r.name in facts.central_noise_ratio:
                lines.append(f"  {r.name}: central DP at ε = {fmt_eps(r.epsilon_user)} per user "
                             f"for the whole run; the noise on a round's sum is "
                             f"{facts.central_noise_ratio[r.name]:,.0f}× the largest sum of the "
                             f"{facts.clients_per_round} expected clients' clipped updates. The "
                             f"same ε costs less noise per client in a larger population.")
            elif ratio is not None:
                lines.append(f"  {r.name}: each upload's noise is {ratio:,.0f}× the largest "
                             f"clipped update (L1 norms), and a round averages only "
                             f"{facts.clients_per_round} clients' uploads.")
            elif not math.isinf(r.epsilon_round):
                lines.append(f"  {r.name}: trained with noise at ε_t = "
                             f"{fmt_eps(r.epsilon_round)} per round"
                             + (" (on α̃ and the labels)" if r.paper_mode else "")
                             + "; in this run it did not rise above chance.")
            else:
                lines.append(f"  {r.name}: no noise; in this run it did not rise above "
                             f"chance.")
        if any(r.auc < CHANCE_AUC for r in near):
            lines.append("  An AUC just below 0.5 is that noise (it lies inside the band), not "
                         "a model that learned to rank backwards.")
    noised_below = [r for r in below if not math.isinf(r.epsilon_round)]
    if noised_below:
        whose = "Their uploads are" if len(noised_below) > 1 else "Its uploads are"
        lines.append(f"- Below the chance band: {_names(noised_below)}. {whose} "
                     f"mostly noise, so the trained model is a fixed random scorer; unlike "
                     f"independent random scores (what the band assumes), its scores are "
                     f"correlated across impressions (the same news recur), so it can land "
                     f"outside the band on either side. That is noise, not a model that "
                     f"learned to rank backwards.")
    plain_below = [r for r in below if math.isinf(r.epsilon_round)]
    if plain_below:
        lines.append(f"- Below the chance band: {_names(plain_below)} (no noise, so not "
                     f"explained by noise; please report it).")
    for r in served:
        base_name = r.name.split(" → ")[0]
        base = next((b for b in trained if b.name == base_name), None)
        if base is None or r.epsilon_query is None:
            continue
        sent = (f"{r.bytes_per_query} bytes per query" if r.bytes_per_query else
                "nothing sent per query (the device downloads the news pool and ranks it "
                "itself)")
        lines.append(f"- {r.name}: test AUC {r.auc:.4f} against {base.auc:.4f} without "
                     f"serving noise, at ε_s = {fmt_eps(r.epsilon_query)} per query and "
                     f"{sent}.")
    by_name = {r.name: r for r in recall}
    if "unifedrec" in by_name and facts.recall_pool:
        u = by_name["unifedrec"]
        other = [r for r in recall if r.name != "unifedrec"]
        vs = "".join(f"; {r.name} {r.future100:.2f}% at ε {r.epsilon}" for r in other)
        lines.append(f"- Recall: Uni-FedRec finds {u.future100:.2f}% of a user's future "
                     f"clicks among 100 recalled news (random picks: "
                     f"{facts.chance_recall(100):.2f}%) at ε {u.epsilon}{vs}. Its 100 "
                     f"recalled news hold {u.history100:.2f}% of the history's clicks "
                     f"(leakage; random picks: {facts.chance_recall(100):.2f}%).")
    lines.append("- What each ε protects: ε_t, one client's upload in one round (fednewsrec, "
                 "dp-fedrec: against replacing all of that user's data; privaterec: α̃ against "
                 "changing one clicked news of the history, and the labels; dp-fedavg: the "
                 "round's noised sum, against replacing all of one user's data); ε_s, one query "
                 "(PrivateRec: one clicked news of the history, with padding; VDP: the whole "
                 "user vector); ε per user, the ledger's composition of everything recorded "
                 "for that user. ∞: nothing bounds what the server learns. docs/privacy.md "
                 "explains each.")
    if facts.runs:
        lines.append(f"- Runs saved in {facts.runs}/ (one directory per row); "
                     f"`privaterec privacy report --run {facts.runs}/privaterec_eps_t=10-nrms` "
                     f"explains a run's budget.")
    return lines


# ----------------------------------------------------------------------------- parsing
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: Sequence[str], header: str) -> list[list[str]]:
    try:
        start = [line.strip() for line in lines].index(header)
    except ValueError:
        raise ValueError(f"table not found: {header[:40]}...") from None
    rows = []
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _num(text: str) -> float:
    text = text.replace(",", "").replace("†", "").strip()
    return math.inf if text == "∞" else float(text)


def _ratios(listing: str) -> dict[str, float]:
    """``"name 3×; other 18,240×"`` (a footnote's list of noise ratios) → ``{name: 3.0, ...}``."""
    ratios = {}
    for part in listing.split("; "):
        name, ratio = part.rsplit(" ", 1)
        ratios[name] = float(ratio.rstrip("×").replace(",", ""))
    return ratios


def parse_demo_output(text: str) -> tuple[list[DemoRow], list[RecallRow], DemoFacts,
                                          list[str]]:
    """Read the tables, facts and closing lines back from the demo's printed output.

    Returns
    -------
    (rows, recall, facts, conclusion)
        ``conclusion`` is the printed closing lines, to compare with
        :func:`demo_conclusion` of the rest.
    """
    lines = text.splitlines()
    legacy = MAIN_HEADER not in (line.strip() for line in lines)
    rows = [DemoRow(name=c[0], auc=float(c[1]), mrr=float(c[2]), ndcg5=float(c[3]),
                    ndcg10=float(c[4]), epsilon_round=_num(c[5]),
                    epsilon_query=None if c[6] == "–" else _num(c[6]),
                    bytes_per_query=None if c[7] == "–" else int(c[7]),
                    epsilon_user=_num(c[8]), paper_mode="†" in c[8], seconds=float(c[-1]),
                    epsilon_user_level=None if legacy else _num(c[9]))
            for c in _table(lines, LEGACY_MAIN_HEADER if legacy else MAIN_HEADER)]
    recall = [RecallRow(name=c[0], future100=float(c[1]), future400=float(c[2]),
                        history100=float(c[3]), auc=float(c[4]), epsilon=c[5],
                        bytes_per_query=int(c[6]))
              for c in _table(lines, RECALL_HEADER)]
    m = re.search(r"- (\d+) test impressions with a click.*?standard error of ([\d.]+)", text)
    if not m:
        raise ValueError("the impressions / chance footnote is missing")
    noise_m = re.search(r"allows \(L1 norms; (\d+) clients per round\): (.*)\.\n", text)
    noise = (_ratios(noise_m.group(2)) if noise_m and noise_m.group(2) != "none" else {})
    central_m = re.search(r"- Central DP \(.*?\): .*?clients per round\): (.*?)\. Its ε_t",
                          text)
    central = _ratios(central_m.group(1)) if central_m else {}
    pool_m = re.search(r"- (\d+) test users, one query each, over a pool of (\d+) news", text)
    runs_m = re.search(r"- Runs saved in (.*?)/ \(one directory per row\)", text)
    facts = DemoFacts(impressions=int(m.group(1)), chance_se=float(m.group(2)),
                      noise_ratio=noise, central_noise_ratio=central,
                      clients_per_round=int(noise_m.group(1)) if noise_m else 0,
                      recall_pool=int(pool_m.group(2)) if pool_m else 0,
                      recall_users=int(pool_m.group(1)) if pool_m else 0,
                      runs=runs_m.group(1) if runs_m else "")
    try:
        start = lines.index("What this shows:")
    except ValueError:
        raise ValueError("the closing lines ('What this shows:') are missing") from None
    conclusion = []
    for line in lines[start:]:
        if not line.strip():
            break
        conclusion.append(line)
    return rows, recall, facts, conclusion


# --------------------------------------------------------------------------- README copy
README_MARKER = "<!-- demo-output -->"


def readme_excerpt(demo_output: str) -> str:
    """The part of the demo's output the README shows: the ranking table and its footnotes,
    the recall table and its footnote, and the closing lines (not the per-run details: the
    one recall query, the HTTP port, model version and titles)."""
    lines = demo_output.rstrip("\n").splitlines()
    main = lines.index(MAIN_HEADER if MAIN_HEADER in lines else LEGACY_MAIN_HEADER)
    # the ranking table and its footnotes run up to the recall section's title
    recall_title = next(i for i, x in enumerate(lines)
                        if x.startswith("Uni-FedRec private recall"))
    recall = lines.index(RECALL_HEADER)
    recall_end = next(i for i in range(recall, len(lines))
                      if "test users, one query each" in lines[i])
    closing = lines.index("What this shows:")
    block = lines[main:recall_title] + lines[recall:recall_end + 1] + [""] + lines[closing:]
    return "\n".join(x for x in block if not x.startswith("Uni-FedRec queries "))


def update_readme(readme: str, demo_output: str) -> str:
    """``readme`` with the ```text block after :data:`README_MARKER` replaced by
    :func:`readme_excerpt` of ``demo_output``."""
    start = readme.index(README_MARKER)
    open_fence = readme.index("```text\n", start) + len("```text\n")
    close_fence = readme.index("```", open_fence)
    return readme[:open_fence] + readme_excerpt(demo_output) + "\n" + readme[close_fence:]


if __name__ == "__main__":  # python -m privaterec.experiments.demo_summary docs/demo.md OUTPUT
    import sys
    from pathlib import Path

    readme_path, output_path = map(Path, sys.argv[1:3])
    readme_path.write_text(update_readme(readme_path.read_text(), output_path.read_text()))
    print(f"{readme_path}: demo output block updated from {output_path}")
