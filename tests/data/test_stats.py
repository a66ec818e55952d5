"""Data-set statistics and `data check` (privaterec.data.stats)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from privaterec.data.mind import load_dataset, read_behaviors
from privaterec.data.records import Impression, MindSplit, NewsRecord
from privaterec.data.stats import (
    check_dataset,
    dataset_statistics,
    format_statistics,
    reference_coverage,
    split_statistics,
)

FRAGMENTS = Path("/work/shared/data/mind-fragments")


def news_lines(ids):
    return [f"{n}\tcat\tsub\ttitle {n}\t\t\t[]\t[]" for n in ids]


TRAIN = [
    "1\tU1\t11/9/2019 8:00:00 AM\tN1 N2\tN3-1 N4-0",
    "2\tU2\t11/9/2019 1:30:00 PM\t\tN1-0 N2-1 N3-1",
    "3\tU1\t11/10/2019 9:00:00 AM\tN1 N2 N3 N4\tN4-0 N3-1 N1-0 N2-0",
]
TEST = [
    "10\tU2\t11/11/2019 10:00:00 AM\tN2\tN5-1 N1-0",
    "11\tU3\t11/11/2019 11:00:00 PM\tN5\tN6-0 N5-1 N3-0",
]


def write(directory: Path, news_ids, behaviors) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "news.tsv").write_text("\n".join(news_lines(news_ids)) + "\n", encoding="utf-8")
    (directory / "behaviors.tsv").write_text("\n".join(behaviors) + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def dataset_dir(tmp_path):
    write(tmp_path / "train", ["N1", "N2", "N3", "N4"], TRAIN)
    write(tmp_path / "test", ["N1", "N2", "N3", "N4", "N5", "N6"], TEST)
    return tmp_path


def test_split_statistics_by_hand(dataset_dir):
    stats = dataset_statistics(load_dataset(dataset_dir))
    train = stats["train"]
    # Computed by hand from TRAIN: history lengths [2, 0, 4].
    assert train["users"] == 2 and train["news"] == 4 and train["impressions"] == 3
    assert train["labelled_impressions"] == 3
    assert train["clicks"] == 4 and train["candidates"] == 9
    assert train["clicks_per_impression"] == pytest.approx(4 / 3)
    assert train["candidates_per_impression"] == pytest.approx(3.0)
    assert train["impressions_without_click"] == 0
    assert train["history_length"] == {"min": 0, "p25": 1.0, "p50": 2.0, "p75": 3.0, "max": 4,
                                       "mean": 2.0}
    assert train["empty_histories"] == 1
    assert train["time"] == {"first": "2019-11-09T08:00:00", "last": "2019-11-10T09:00:00"}
    assert train["coverage"] == {"referenced_news": 4, "present_news": 4, "news_coverage": 1.0,
                                 "references": 15, "resolved_references": 15,
                                 "reference_coverage": 1.0}
    test = stats["test"]
    assert test["users"] == 2 and test["clicks"] == 2 and test["candidates"] == 5
    assert test["time"]["last"] == "2019-11-11T23:00:00"
    assert stats["overlap"] == {
        "test_users": 2, "test_users_seen_in_train": 1, "test_users_seen_in_train_share": 0.5,
        "test_candidate_news": 4, "test_candidate_news_seen_in_train": 2,
        "test_candidate_news_seen_in_train_share": 0.5,
        "test_candidate_references_seen_in_train_share": pytest.approx(0.4),
    }


def test_coverage_with_missing_news_by_hand(dataset_dir):
    behaviors = read_behaviors(dataset_dir / "train" / "behaviors.tsv")
    coverage = reference_coverage({"N1", "N2"}, behaviors)
    # Resolved: imp1 2 + 0, imp2 0 + 2, imp3 2 + 2 of 15 references.
    assert coverage == {"referenced_news": 4, "present_news": 2, "news_coverage": 0.5,
                        "references": 15, "resolved_references": 8,
                        "reference_coverage": pytest.approx(8 / 15)}


def test_coverage_counts_shared_histories_per_impression(tmp_path):
    # Two impressions share the history string (one shared tuple after reading); a generator
    # of fresh tuples must give the same numbers.
    path = tmp_path / "behaviors.tsv"
    path.write_text("1\tU1\t1/1/2020 1:00:00 AM\tA X\tA-1\n"
                    "2\tU1\t1/1/2020 2:00:00 AM\tA X\tX-1\n", encoding="utf-8")
    behaviors = read_behaviors(path)
    assert behaviors[0].history is behaviors[1].history
    expected = {"referenced_news": 2, "present_news": 1, "news_coverage": 0.5,
                "references": 6, "resolved_references": 3, "reference_coverage": 0.5}
    assert reference_coverage({"A"}, behaviors) == expected
    fresh = (Impression(i.impression_id, i.user_id, i.time, tuple(list(i.history)),
                        i.candidates, i.labels) for i in behaviors)
    assert reference_coverage({"A"}, fresh) == expected


def test_unlabelled_and_empty_split():
    t = datetime(2020, 1, 1)
    split = MindSplit({"A": NewsRecord("A")}, [Impression("1", "u", t, (), ("A",), None)])
    stats = split_statistics(split)
    assert stats["labelled_impressions"] == 0 and stats["clicks"] == 0
    assert stats["clicks_per_impression"] is None
    empty = split_statistics(MindSplit({}, []))
    assert empty["impressions"] == 0 and empty["history_length"]["mean"] is None
    assert empty["coverage"]["news_coverage"] is None
    assert "-" in format_statistics(empty)


def test_check_valid_dataset_and_format(dataset_dir):
    valid, report = check_dataset(dataset_dir)
    assert valid and report["valid"] and report["errors"] == []
    assert report["train"]["impressions"] == 3 and report["test"]["impressions"] == 2
    json.dumps(report)  # the CLI prints it with --json
    text = format_statistics(report)
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["impressions"].split()[-2:] == ["3", "2"]
    assert lines["clicks / impression"].split()[-2:] == ["1.333", "1"]
    assert "test users seen in train: 50.00% (1/2)" in text
    assert text.rstrip().endswith("VALID")


def test_check_reports_format_error(dataset_dir):
    (dataset_dir / "test" / "behaviors.tsv").write_text(
        TEST[0] + "\n" + "11\tU3\tnot a time\t\tN1-1\n", encoding="utf-8")
    valid, report = check_dataset(dataset_dir)
    assert not valid
    assert report["errors"] == [f"{dataset_dir / 'test' / 'behaviors.tsv'}:2: time 'not a time'"
                                " is not in the MIND format MM/DD/YYYY HH:MM:SS AM|PM (e.g. "
                                "11/9/2019 8:36:57 AM)"]
    assert report["train"]["impressions"] == 3 and report["test"] is None
    assert "INVALID" in format_statistics(report)


def test_check_not_a_dataset(tmp_path):
    valid, report = check_dataset(tmp_path / "absent")
    assert not valid and "does not exist" in report["errors"][0]
    assert report["train"] is None


def test_check_warns_on_non_temporal_split(dataset_dir):
    write(dataset_dir / "test", ["N1", "N2"], ["10\tU2\t11/8/2019 10:00:00 AM\tN2\tN1-1"])
    valid, report = check_dataset(dataset_dir)
    assert valid
    assert any("not a temporal split" in w for w in report["warnings"])


def test_check_fragments_coverage():
    if not FRAGMENTS.is_dir():
        pytest.skip(f"{FRAGMENTS} is absent")
    news_ids = {line.split("\t", 1)[0] for line in
                (FRAGMENTS / "news.tsv").read_text(encoding="utf-8").splitlines()}
    referenced, references, resolved = set(), 0, 0
    for line in (FRAGMENTS / "behaviors.tsv").read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        ids = cols[3].split() + [t.rsplit("-", 1)[0] for t in cols[4].split()]
        referenced.update(ids)
        references += len(ids)
        resolved += sum(n in news_ids for n in ids)
    present = len(referenced & news_ids)

    valid, report = check_dataset(FRAGMENTS)
    assert not valid
    assert len(report["errors"]) == 1 and "missing from news.tsv" in report["errors"][0]
    coverage = report["train"]["coverage"]
    assert coverage["referenced_news"] == len(referenced)
    assert coverage["present_news"] == present
    assert coverage["references"] == references and coverage["resolved_references"] == resolved
    assert 0.005 < coverage["news_coverage"] < 0.02  # "about 1%" (README)
    assert report["train"]["impressions"] == 2000

    valid, report = check_dataset(FRAGMENTS, drop_missing=True)
    assert valid and report["errors"] == []
    assert report["train"]["coverage"] == coverage  # coverage of the files as written
    dropped = report["train"]["dropped"]
    assert dropped["missing_news_ids"] == len(referenced) - present
    assert report["train"]["impressions"] == 2000 - dropped["impressions"]
    assert any("dropped" in w for w in report["warnings"])
    assert f"({present:,}/{len(referenced):,})" in format_statistics(report)
