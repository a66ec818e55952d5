"""The demo's closing lines: computed from its tables, consistent with docs/demo.md."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from privaterec.experiments.demo_summary import (DemoFacts, DemoRow, RecallRow, chance_auc_se,
                                                 demo_conclusion, format_main_footnotes,
                                                 format_main_table, format_recall_footnote,
                                                 format_recall_table, parse_demo_output)

ROOT = Path(__file__).resolve().parents[2]


def _rows() -> list[DemoRow]:
    inf = math.inf
    return [
        DemoRow("popularity", 0.5215, 0.2, 0.2, 0.25, inf, None, None, inf),
        DemoRow("centralized / nrms", 0.7734, 0.3, 0.3, 0.4, inf, None, None, inf),
        DemoRow("fedrec / nrms", 0.7806, 0.3, 0.3, 0.4, inf, None, None, inf),
        DemoRow("dp-fedrec eps_t=10 / nrms", 0.4991, 0.15, 0.12, 0.2, 10.0, None, None, 150.0),
        DemoRow("privaterec eps_t=10 / nrms", 0.6070, 0.2, 0.2, 0.3, 10.0, None, None, 150.0,
                paper_mode=True),
        DemoRow("privaterec eps_t=10 / nrms → privaterec serving", 0.5740, 0.2, 0.2, 0.3,
                10.0, 10.0, 20, 160.0, paper_mode=True),
    ]


def _recall() -> list[RecallRow]:
    return [RecallRow("unifedrec", 1.53, 5.9, 1.71, 0.51, "≤ 10 + quotas sent unprotected", 124),
            RecallRow("youtubenet", 9.33, 30.1, 21.06, 0.56, "∞ (user vector sent in the clear)",
                      512)]


FACTS = DemoFacts(impressions=1246, chance_se=0.0072,
                  noise_ratio={"dp-fedrec eps_t=10 / nrms": 18240.0}, clients_per_round=40,
                  recall_pool=5969, recall_users=1000, runs="~/.cache/privaterec/demo/runs")


def _printed(rows, recall, facts) -> str:
    """The demo's output, as run_demo assembles it (tables, footnotes, closing lines)."""
    return "\n".join([format_main_table(rows), "", format_main_footnotes(facts, delta=1e-5),
                      "", format_recall_table(recall), format_recall_footnote(facts), "",
                      *demo_conclusion(rows, recall, facts)])


def test_chance_se_matches_random_scores():
    rng = random.Random(3)
    impressions = [[1] * rng.randint(1, 2) + [0] * rng.randint(8, 38) for _ in range(300)]
    count, se = chance_auc_se(impressions + [[0, 0, 0], [1]])  # one-class rows are left out
    assert count == 300
    means = []
    for _ in range(400):  # the mean AUC of random scores over the 300 impressions
        total = 0.0
        for labels in impressions:
            scores = [rng.random() for _ in labels]
            pos = [s for s, y in zip(scores, labels) if y]
            neg = [s for s, y in zip(scores, labels) if not y]
            total += sum(p > n for p in pos for n in neg) / (len(pos) * len(neg))
        means.append(total / len(impressions))
    mean = sum(means) / len(means)
    sd = math.sqrt(sum((m - mean) ** 2 for m in means) / (len(means) - 1))
    assert abs(mean - 0.5) < 4 * se / math.sqrt(len(means)) + 1e-3
    assert sd == pytest.approx(se, rel=0.15)  # 400 draws: the sd is known to ~4%


def test_conclusion_sorts_rows_by_the_chance_band_and_explains_noise():
    lines = demo_conclusion(_rows(), _recall(), FACTS)
    text = "\n".join(lines)
    assert lines[0] == "What this shows:"
    learn = next(line for line in lines if line.startswith("- Learn"))
    near = next(line for line in lines if line.startswith("- Near chance"))
    assert "0.486–0.514" in learn  # 0.5 ± 2 × 0.0072
    assert "privaterec eps_t=10 / nrms 0.6070" in learn and "popularity 0.5215" in learn
    assert near == "- Near chance (inside the band): dp-fedrec eps_t=10 / nrms 0.4991."
    assert "18,240× the largest clipped update" in text and "40 clients" in text
    assert "not a model that learned to rank backwards" in text  # 0.4991 < 0.5
    assert "where dp-fedrec eps_t=10 / nrms does not" in text  # same ε_t, paper mode
    assert "20 bytes per query" in text and "0.5740 against 0.6070" in text
    assert "random picks: 1.68%" in text  # 100 / 5969
    assert "What each ε protects" in text
    assert "Runs saved in ~/.cache/privaterec/demo/runs/" in text


def test_below_chance_rows_are_not_called_noise():
    rows = [DemoRow("broken", 0.40, 0.1, 0.1, 0.1, math.inf, None, None, math.inf)]
    text = "\n".join(demo_conclusion(rows, [], FACTS))
    assert "Below the chance band: broken 0.4000" in text
    assert "rank backwards" not in text


def test_noised_rows_below_chance_are_explained_as_noise():
    """dp-fedrec below 0.5 deserves a word (noise, not anti-learning)."""
    rows = [DemoRow("dp-fedrec eps_t=10 / nrms", 0.48, 0.1, 0.1, 0.1, 10.0, None, None, 150.0)]
    text = "\n".join(demo_conclusion(rows, [], FACTS))
    assert "Below the chance band: dp-fedrec eps_t=10 / nrms 0.4800. Its uploads" in text
    assert "not a model that learned to rank backwards" in text
    assert "please report" not in text


def test_printed_output_round_trips():
    rows, recall, facts, conclusion = parse_demo_output(_printed(_rows(), _recall(), FACTS))
    assert [r.name for r in rows] == [r.name for r in _rows()]
    assert rows[4].paper_mode and rows[5].bytes_per_query == 20 and rows[5].epsilon_query == 10
    assert facts == FACTS
    assert conclusion == demo_conclusion(rows, recall, facts)


def _readme_demo_block() -> str:
    text = (ROOT / "docs" / "demo.md").read_text()
    match = re.search(r"<!-- demo-output -->\n```text\n(.*?)```", text, re.S)
    assert match, "docs/demo.md must show the demo's output in a ```text block after " \
                  "<!-- demo-output -->"
    return match.group(1)


def test_readme_demo_output_is_consistent_number_for_number():
    """docs/demo.md's copy of the demo's output: its closing lines are what demo_conclusion
    computes from its tables and footnotes, and the docs' prose quotes the same numbers."""
    block = _readme_demo_block()
    rows, recall, facts, conclusion = parse_demo_output(block)
    assert conclusion == demo_conclusion(rows, recall, facts)
    by_name = {r.name: r for r in rows}
    readme = (ROOT / "docs" / "demo.md").read_text()
    results = (ROOT / "docs" / "results.md").read_text()
    served = by_name["privaterec eps_t=10 / nrms → privaterec serving"]
    vdp = by_name["fedrec / nrms → vdp serving"]
    # the docs' prose quotes the block's numbers (one definition of bytes per query)
    assert f"PrivateRec B = 5 floats = {served.bytes_per_query} bytes" in readme
    assert f"PrivateRec {served.bytes_per_query}, VDP" in results
    assert f"VDP\n  {vdp.bytes_per_query} (d = 128)" in results
    assert facts.runs == "~/.cache/privaterec/demo/runs"  # the default --out
    # every method has an ε (∞ when there is no guarantee), in the results' tables too
    for line in results.splitlines():
        if line.startswith("| popularity |") or line.startswith("| centralized"):
            assert "–" not in line, line


def test_update_readme_replaces_only_the_block():
    from privaterec.experiments.demo_summary import update_readme

    printed = _printed(_rows(), _recall(), FACTS)
    # the demo also prints the one recall query and the HTTP part; the README leaves them out
    lines = printed.splitlines()
    at = lines.index(format_recall_table(_recall()).splitlines()[0])
    output = "\n".join(lines[:at] + ["Uni-FedRec private recall (...):", "", "- user U1 ...",
                                      ""] + lines[at:]).replace(
        "What this shows:", "Private query over HTTP (http://127.0.0.1:1):\n- sent ...\n\n"
        "What this shows:")
    readme = "intro\n<!-- demo-output -->\n```text\nSTALE\n```\n\n## Results\n"
    updated = update_readme(readme, output)
    assert updated.startswith("intro\n<!-- demo-output -->\n```text\n|")
    assert updated.endswith("```\n\n## Results\n") and "STALE" not in updated
    assert "127.0.0.1" not in updated and "user U1" not in updated
    block = updated.split("```text\n")[1].split("```")[0]
    rows, recall, facts, conclusion = parse_demo_output(block)
    assert facts == FACTS and conclusion == demo_conclusion(rows, recall, facts)
