"""The demo's ranking rows: per-user ε at both adjacencies, and serving rows that carry only
their own evaluation's queries (local ranking adds nothing to its run's training)."""

from __future__ import annotations

import math

from privaterec.config import ModelConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.experiments.demo import DemoEntry, _train_entry
from privaterec.experiments.demo_summary import (MAIN_HEADER, DemoRow, format_main_table,
                                                 parse_demo_output)
from privaterec.ondevice.release import ServingConfig
from privaterec.privacy.report import read_privacy_json

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
SYNTH = SynthConfig(users=60, news=150, seed=3, impressions_per_user=2, min_history=5,
                    max_history=15, max_candidates=15)


def test_local_ranking_row_shows_the_training_epsilon_not_the_dpa_rows(tmp_path):
    data = tmp_path / "data"
    write_synthetic(data, SYNTH)
    entry = DemoEntry("privaterec eps_t=10 / tiny", TINY, TrainConfig(method="privaterec"),
                      # every user trains in both rounds: all share the top training ε,
                      # so any user's queries show in the maximum
                      fed_config("privaterec", rounds=2, epsilon_train=10.0,
                                 client_fraction=1.0),
                      serve=(ServingConfig(kind="privaterec", epsilon=10.0),
                             ServingConfig(kind="local")))
    rows, _ = _train_entry(entry, str(data), str(tmp_path), False)
    trained, dpa, local = rows
    assert local.epsilon_query == 0.0 and dpa.epsilon_query == 10.0
    # local ranking: the run's training ε per user, nothing added by serving ...
    assert local.epsilon_user == trained.epsilon_user
    assert local.epsilon_user_level == trained.epsilon_user_level
    # ... while the DPA row adds its own queries, and only once
    assert dpa.epsilon_user > trained.epsilon_user
    run = tmp_path / "runs" / "privaterec_eps_t=10-tiny"
    training = read_privacy_json(run)["report"]["phases"]["total"]["epsilon_max"]
    assert math.isclose(trained.epsilon_user, training)
    # every row states both adjacencies
    assert all(r.epsilon_user_level is not None for r in rows)
    assert all(r.epsilon_user_level >= r.epsilon_user for r in rows)


def test_the_table_shows_both_adjacencies_under_a_clear_header():
    rows = [DemoRow("dp-fedavg (central) eps=8 / nrms", 0.58, 0.2, 0.2, 0.28, 2.01, None, None,
                    7.95, seconds=205, epsilon_user_level=7.95),
            DemoRow("privaterec eps_t=10 / nrms", 0.53, 0.19, 0.17, 0.25, 10.0, None, None,
                    150.0, paper_mode=True, seconds=51, epsilon_user_level=math.inf)]
    table = format_main_table(rows)
    assert "ε per user (max), click-level | ε per user (max), user-level" in MAIN_HEADER
    assert table.splitlines()[0] == MAIN_HEADER
    assert "| 7.95 | 7.95 | 205 |" in table and "| 150 † | ∞ | 51 |" in table
    lines = table.splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    parsed = [r for r in _parse(table)]
    assert [(r.epsilon_user, r.epsilon_user_level) for r in parsed] == \
        [(7.95, 7.95), (150.0, math.inf)]


def _parse(table: str) -> list[DemoRow]:
    text = (table + "\n\n- 10 test impressions with a click and a non-click. Random scores give "
            "AUC 0.5 with a standard error of 0.0100 over them.\n\n"
            "| recall | future clicks found in 100 (%) | future clicks found in 400 (%) | "
            "history clicks found in 100 (%, leakage) | AUC ranking the 400 found | ε per "
            "query | bytes per query |\n|---|---|---|---|---|---|---|\n\nWhat this shows:\n- x\n")
    return parse_demo_output(text)[0]
