"""Popularity baseline on a hand-made split, with hand-computed scores and metrics."""

from __future__ import annotations

import json
import math
from datetime import datetime

import numpy as np
import pytest

from privaterec.data.records import Impression, MindSplit
from privaterec.errors import CheckpointError
from privaterec.training.popularity import (PopularityModel, cold_candidates_share,
                                            evaluate_popularity)

T0 = datetime(2023, 5, 18, 7, 0, 0)


def imp(iid, candidates, labels, history=()):
    return Impression(iid, "U1", T0, tuple(history), tuple(candidates),
                      None if labels is None else tuple(labels))


# clicks: A=2, B=1 (history clicks of X are not counted); shown: A=3, B=3, C=2, D=1, E=1.
TRAIN = MindSplit(news={}, behaviors=[
    imp("1", "ABC", [1, 0, 0], history="XX"),
    imp("2", "ABD", [0, 1, 0]),
    imp("3", "AC", [1, 0]),
    imp("4", "BE", None),  # unlabelled: counts as shown only
])
TEST = MindSplit(news={}, behaviors=[
    imp("t1", "BAF", [0, 1, 0]),
    imp("t2", "CDFA", [0, 1, 0, 0]),
    imp("t3", "FG", [1, 0]),
    imp("t4", "AG", None),
])


def test_fit_counts_training_impressions():
    model = PopularityModel.fit(TRAIN)
    assert model.clicks == {"A": 2, "B": 1}
    assert model.shown == {"A": 3, "B": 3, "C": 2, "D": 1, "E": 1}
    assert model.known_news == frozenset("ABCDE")


def test_score_clicks_then_exposure_tie_break():
    model = PopularityModel.fit(TRAIN)
    # clicks + shown / (1 + max shown) with max shown = 3.
    np.testing.assert_allclose(model.score(list("ABCDEF")),
                               [2.75, 1.75, 0.5, 0.25, 0.25, 0.0])
    assert model.score([]).shape == (0,)
    # The exposure term never overrides a click: 1 click shown once beats 0 clicks shown 100x.
    lopsided = PopularityModel({"X": 1}, {"X": 1, "Y": 100})
    x, y = lopsided.score(["X", "Y"])
    assert x > y > 0


def test_evaluate_popularity_hand_computed():
    result = evaluate_popularity(PopularityModel.fit(TRAIN), TEST)
    # t1: A (2.75) first → AUC 1, MRR 1, nDCG 1.
    # t2: scores C .5, D .25, F 0, A 2.75; clicked D ranks 3rd → AUC 1/3, MRR 1/3, nDCG 1/log2 4.
    # t3: F and G both 0 → AUC 1/2; the official tie-break puts G first → MRR 1/2,
    #     nDCG 1/log2 3.
    assert result["auc"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert result["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)
    assert result["ndcg@5"] == pytest.approx((1 + 0.5 + 1 / math.log2(3)) / 3)
    assert result["ndcg@10"] == pytest.approx(result["ndcg@5"])
    assert result["impressions"] == result["auc_impressions"] == 3
    assert result["unlabelled_impressions"] == 1
    # Cold candidate slots of labelled impressions: F in t1, F in t2, F and G in t3 → 4 of 9.
    assert result["cold_candidates_share"] == pytest.approx(4 / 9)


def test_cold_candidates_share():
    known = {"A", "B"}
    assert cold_candidates_share(TEST.behaviors, known) == pytest.approx(7 / 11)
    assert cold_candidates_share(TEST.behaviors, set("ABCDFG")) == 0.0
    with pytest.raises(ValueError, match="no candidate"):
        cold_candidates_share([], known)


def test_save_load_round_trip(tmp_path):
    model = PopularityModel.fit(TRAIN)
    path = tmp_path / "popularity.json"
    model.save(path)
    loaded = PopularityModel.load(path)
    assert loaded.clicks == model.clicks and loaded.shown == model.shown
    np.testing.assert_array_equal(loaded.score(list("ABCDEFG")), model.score(list("ABCDEFG")))


def test_load_errors_name_the_file(tmp_path):
    path = tmp_path / "model.json"
    with pytest.raises(CheckpointError, match="model.json: popularity model file not found"):
        PopularityModel.load(path)
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="not a JSON popularity model"):
        PopularityModel.load(path)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not a popularity model"):
        PopularityModel.load(path)
    path.write_text(json.dumps({"format": "privaterec-popularity", "version": 99}))
    with pytest.raises(CheckpointError, match="version 99 is not supported"):
        PopularityModel.load(path)
    path.write_text(json.dumps({"format": "privaterec-popularity", "version": 1,
                                "clicks": {"A": -1}, "shown": {}}))
    with pytest.raises(CheckpointError, match=r"clicks\['A'\] must be a non-negative integer"):
        PopularityModel.load(path)


def test_evaluate_popularity_needs_labels():
    split = MindSplit(news={}, behaviors=[imp("u", "AB", None)])
    with pytest.raises(ValueError, match="no labelled impression"):
        evaluate_popularity(PopularityModel.fit(TRAIN), split)
