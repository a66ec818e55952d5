"""EB-NeRD → MIND conversion (privaterec.data.ebnerd)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privaterec.data.ebnerd import convert_ebnerd, read_articles
from privaterec.data.mind import load_dataset, read_split
from privaterec.data.records import Impression, NewsRecord
from privaterec.data.stats import dataset_statistics
from privaterec.errors import ConfigError, DataFormatError

DEMO = Path("/work/shared/data/ebnerd-demo/train")


def ts(day: int, hour: int, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    return datetime(2023, 5, day, hour, minute, second, micro)


@pytest.fixture
def ebnerd_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    behaviors = pa.table({
        "impression_id": pa.array([101, 102, 103, 104, 105], pa.uint32()),
        "impression_time": pa.array([ts(18, 8), ts(18, 9, 30, 5, 250), ts(19, 7),
                                     ts(20, 6, 59, 59), ts(20, 7, 0, 1)], pa.timestamp("us")),
        "user_id": pa.array([1, 2, 1, 3, 2], pa.uint32()),
        # 102: duplicate in-view id and duplicate click; 103: click outside the view;
        # 105: empty view, only a click outside it; 104: empty view, no click.
        "article_ids_inview": pa.array([[11, 12, 13], [12, 14, 12], [13, 15], [], []],
                                       pa.large_list(pa.int32())),
        "article_ids_clicked": pa.array([[12], [14, 14], [16], [], [11]],
                                        pa.large_list(pa.int32())),
        "read_time": pa.array([1.0, 2.0, 3.0, 4.0, 5.0], pa.float32()),
    })
    pq.write_table(behaviors, src / "behaviors.parquet")
    history = pa.table({
        "user_id": pa.array([1, 2, 9], pa.uint32()),
        # user 1's clicks are stored out of order; user 3 has no history row.
        "impression_time_fixed": pa.array([[ts(10, 9), ts(10, 8), ts(11, 1)],
                                           [ts(12, 1)], [ts(12, 2)]],
                                          pa.large_list(pa.timestamp("us"))),
        "article_id_fixed": pa.array([[21, 20, 22], [23], [99]], pa.large_list(pa.int32())),
    })
    pq.write_table(history, src / "history.parquet")
    return src


@pytest.fixture
def articles_file(tmp_path):
    table = pa.table({
        "article_id": pa.array([11, 12, 20, 77], pa.int32()),
        "title": ["Første titel", "Two\ttabs", None, "unused"],
        "subtitle": ["Sub one", "", "Sub 20", "x"],
        "category_str": ["sport", "nyheder", "krimi", "x"],
        "subcategory": pa.array([[142, 7], [], [3], [1]], pa.list_(pa.int16())),
        "url": ["https://eb.dk/11", None, "https://eb.dk/20", "u"],
    })
    path = tmp_path / "articles.parquet"
    pq.write_table(table, path)
    return path


def test_convert_single_split_exact_output(ebnerd_dir, tmp_path):
    out = tmp_path / "out"
    report = convert_ebnerd(ebnerd_dir, out, test_days=None)
    # The exact MIND lines, written by hand from the fixture and the documented mapping.
    assert (out / "behaviors.tsv").read_text(encoding="utf-8").splitlines() == [
        "101\t1\t5/18/2023 8:00:00 AM\t20 21 22\t11-0 12-1 13-0",
        "102\t2\t5/18/2023 9:30:05 AM\t23\t12-0 14-1",
        "103\t1\t5/19/2023 7:00:00 AM\t20 21 22\t13-0 15-0 16-1",
        "105\t2\t5/20/2023 7:00:01 AM\t23\t11-1",
    ]
    split = read_split(out)  # no missing references
    assert list(split.news) == ["11", "12", "13", "14", "15", "16", "20", "21", "22", "23"]
    assert split.news["16"] == NewsRecord("16")  # ID-only row
    assert (out / "news.tsv").read_text().splitlines()[0] == "11\t\t\t\t\t\t[]\t[]"
    assert report["split"] is None
    assert report["source_impressions"] == 5 and report["impressions"] == 4
    assert report["users"] == 2 and report["articles"] == 10
    assert report["clicks"] == 4 and report["candidates"] == 9
    assert report["history_references"] == 4  # users 1 (3) and 2 (1); user 3 was dropped
    assert report["clicked_not_in_inview"] == 2
    assert report["added"] == {"clicked_not_in_inview": 2}
    assert report["dropped"] == {"clicked_not_in_inview": 0, "duplicate_clicks": 1,
                                 "duplicate_inview": 1, "impressions_without_candidates": 1,
                                 "subsecond_times_truncated": 1,
                                 "history_references_beyond_max_history": 0}
    assert report["users_without_history"] == 0
    assert report["articles_with_text"] == 0 and report["articles_without_text"] == 10


def test_drop_policy_and_max_history(ebnerd_dir, tmp_path):
    out = tmp_path / "out"
    report = convert_ebnerd(ebnerd_dir, out, test_days=None, clicked_not_inview="drop",
                            max_history=2)
    split = read_split(out)
    by_id = {imp.impression_id: imp for imp in split.behaviors}
    assert sorted(by_id) == ["101", "102", "103"]
    assert by_id["103"] == Impression("103", "1", ts(19, 7), ("21", "22"), ("13", "15"), (0, 0))
    assert report["dropped"]["clicked_not_in_inview"] == 2
    assert report["added"]["clicked_not_in_inview"] == 0
    assert report["dropped"]["impressions_without_candidates"] == 2
    assert report["dropped"]["history_references_beyond_max_history"] == 1
    assert report["impressions_without_click"] == 1
    assert "20" not in split.news and "16" not in split.news


def test_temporal_split(ebnerd_dir, tmp_path):
    out = tmp_path / "out"
    report = convert_ebnerd(ebnerd_dir, out, test_days=1)
    # Last impression 5/20 07:00:01 → boundary 5/19 07:00:01; 103 (5/19 07:00:00) is train.
    assert report["split"]["boundary"] == "2023-05-19T07:00:01"
    dataset = load_dataset(out)
    assert [i.impression_id for i in dataset.train.behaviors] == ["101", "102", "103"]
    assert [i.impression_id for i in dataset.test.behaviors] == ["105"]
    assert dataset.train.news == dataset.test.news and len(dataset.train.news) == 10
    assert report["split"]["train_impressions"] == 3 and report["split"]["test_impressions"] == 1
    assert report["split"]["test_users"] == 1
    with pytest.raises(ConfigError, match="test_days=5"):
        convert_ebnerd(ebnerd_dir, tmp_path / "out2", test_days=5)


def test_user_without_history(ebnerd_dir, tmp_path):
    history = pq.read_table(ebnerd_dir / "history.parquet")
    pq.write_table(history.slice(0, 1), ebnerd_dir / "history.parquet")  # only user 1
    report = convert_ebnerd(ebnerd_dir, tmp_path / "out", test_days=None)
    split = read_split(tmp_path / "out")
    assert [imp.history for imp in split.behaviors if imp.user_id == "2"] == [(), ()]
    assert report["users_without_history"] == 1


def test_articles_fill_text(ebnerd_dir, articles_file, tmp_path):
    records = read_articles(articles_file)
    assert records["11"] == NewsRecord("11", "sport", "142", "Første titel", "Sub one",
                                       "https://eb.dk/11")
    assert records["12"] == NewsRecord("12", "nyheder", "", "Two\ttabs", "", "")
    report = convert_ebnerd(ebnerd_dir, tmp_path / "out", articles=articles_file,
                            test_days=None)
    news = read_split(tmp_path / "out").news
    assert news["11"].title == "Første titel" and news["11"].category == "sport"
    assert news["12"].title == "Two tabs"  # tab replaced on writing
    assert news["20"] == NewsRecord("20", "krimi", "3", "", "Sub 20", "https://eb.dk/20")
    assert news["13"] == NewsRecord("13")
    assert "77" not in news  # unreferenced article
    assert report["articles_with_text"] == 3 and report["articles_without_text"] == 7


def test_input_errors(ebnerd_dir, tmp_path):
    (ebnerd_dir / "history.parquet").rename(tmp_path / "h.parquet")
    with pytest.raises(DataFormatError, match="history.parquet.*file not found"):
        convert_ebnerd(ebnerd_dir, tmp_path / "o1")
    (tmp_path / "h.parquet").rename(ebnerd_dir / "history.parquet")
    table = pq.read_table(ebnerd_dir / "behaviors.parquet").drop(["article_ids_clicked"])
    pq.write_table(table, ebnerd_dir / "behaviors.parquet")
    with pytest.raises(DataFormatError, match="missing column.*article_ids_clicked"):
        convert_ebnerd(ebnerd_dir, tmp_path / "o2")
    with pytest.raises(ConfigError, match="clicked_not_inview"):
        convert_ebnerd(ebnerd_dir, tmp_path / "o3", clicked_not_inview="keep")
    with pytest.raises(ConfigError, match="test_days"):
        convert_ebnerd(ebnerd_dir, tmp_path / "o3", test_days=0)


def test_refuses_non_empty_output(ebnerd_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        convert_ebnerd(ebnerd_dir, out)
    convert_ebnerd(ebnerd_dir, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="different layout"):
        convert_ebnerd(ebnerd_dir, out, test_days=None, overwrite=True)


def test_real_demo_converts_and_loads(tmp_path):
    if not (DEMO / "behaviors.parquet").is_file():
        pytest.skip(f"{DEMO} is absent")
    import pandas as pd

    behaviors = pd.read_parquet(DEMO / "behaviors.parquet",
                                columns=["impression_id", "user_id", "impression_time",
                                         "article_ids_clicked"])
    expected_clicks = int(sum(len(set(c.tolist())) for c in behaviors["article_ids_clicked"]))
    out = tmp_path / "mind"
    report = convert_ebnerd(DEMO, out, max_history=50)
    dataset = load_dataset(out)  # default: fails on any missing reference
    assert dataset.test is not None
    train, test = dataset.train.behaviors, dataset.test.behaviors
    assert len(train) + len(test) == len(behaviors) == report["impressions"]
    assert report["users"] == behaviors["user_id"].nunique()
    assert max(i.time for i in train) <= datetime.fromisoformat(report["split"]["boundary"])
    assert min(i.time for i in test) > datetime.fromisoformat(report["split"]["boundary"])
    assert max(i.time for i in test) == behaviors["impression_time"].max().to_pydatetime()
    assert len(test) == int((behaviors["impression_time"]
                             > behaviors["impression_time"].max() - pd.Timedelta(days=1)).sum())
    stats = dataset_statistics(dataset)
    assert stats["train"]["clicks"] + stats["test"]["clicks"] == expected_clicks == report["clicks"]
    assert stats["train"]["coverage"]["reference_coverage"] == 1.0
    assert stats["train"]["history_length"]["max"] == 50
    assert 1.0 <= stats["train"]["clicks_per_impression"] < 1.5
    assert stats["train"]["candidates_per_impression"] > 5  # EB-NeRD shows >= 5 in view
    assert 0 < stats["overlap"]["test_users_seen_in_train_share"] <= 1
