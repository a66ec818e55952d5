"""MIND-format reading, validation and writing (privaterec.data.mind)."""

from __future__ import annotations

import time as _time
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privaterec.data.mind import (
    format_time,
    load_dataset,
    parse_time,
    read_behaviors,
    read_news,
    read_split,
    split_directories,
    write_behaviors,
    write_dataset,
    write_news,
)
from privaterec.data.records import (
    MIND_TIME_FORMAT,
    Impression,
    MindDataset,
    MindSplit,
    NewsRecord,
)
from privaterec.errors import DataFormatError, MissingNewsError

FRAGMENTS = Path("/work/shared/data/mind-fragments")

NEWS_LINES = [
    "N1\tsports\tfootball\tA title\tAn abstract\thttps://x/1\t[]\t[]",
    "N2\tnews\tpolitics\tTitle två ü\t\t\t[{\"Label\": \"X\"}]\t",
    "N3\tlifestyle\troyals\tThird\tabs\turl\t[]\t[]",
]
BEHAVIOR_LINES = [
    "1\tU1\t11/11/2019 9:05:58 AM\tN1 N2\tN3-1 N1-0",
    "2\tU2\t11/9/2019 12:00:01 AM\t\tN2-0 N3-1 N1-1",
    "3\tU1\t1/2/2020 12:30:00 PM\tN1 N2\tN3 N2",
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def make_split(directory: Path, news: list[str] = NEWS_LINES,
               behaviors: list[str] = BEHAVIOR_LINES) -> Path:
    write_lines(directory / "news.tsv", news)
    write_lines(directory / "behaviors.tsv", behaviors)
    return directory


def error_of(func, *args, **kwargs) -> DataFormatError:
    with pytest.raises(DataFormatError) as info:
        func(*args, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- reading
def test_read_news_fields(tmp_path):
    news = read_news(write_lines(tmp_path / "news.tsv", NEWS_LINES))
    assert list(news) == ["N1", "N2", "N3"]
    assert news["N1"] == NewsRecord("N1", "sports", "football", "A title", "An abstract",
                                    "https://x/1", "[]", "[]")
    assert news["N2"].abstract == "" and news["N2"].title == "Title två ü"
    assert news["N2"].title_entities == '[{"Label": "X"}]' and news["N2"].abstract_entities == ""


def test_read_behaviors_fields(tmp_path):
    behaviors = read_behaviors(write_lines(tmp_path / "behaviors.tsv", BEHAVIOR_LINES))
    assert behaviors[0] == Impression("1", "U1", datetime(2019, 11, 11, 9, 5, 58), ("N1", "N2"),
                                      ("N3", "N1"), (1, 0))
    # 12 AM is midnight, 12 PM is noon; empty history; unlabelled candidates.
    assert behaviors[1].time == datetime(2019, 11, 9, 0, 0, 1)
    assert behaviors[1].history == () and behaviors[1].labels == (0, 1, 1)
    assert behaviors[1].clicked == ("N3", "N1")
    assert behaviors[2].time == datetime(2020, 1, 2, 12, 30, 0)
    assert behaviors[2].candidates == ("N3", "N2") and behaviors[2].labels is None


def test_crlf_bom_and_blank_lines_keep_line_numbers(tmp_path):
    path = tmp_path / "news.tsv"
    body = "\ufeff" + NEWS_LINES[0] + "\r\n\r\n" + NEWS_LINES[1] + "\r\n" + "N4\tonly\ttwo\n"
    path.write_bytes(body.encode("utf-8"))
    err = error_of(read_news, path)
    assert err.line == 4 and str(err).startswith(f"{path}:4:")
    path.write_bytes(body.rsplit("N4", 1)[0].encode("utf-8"))
    news = read_news(path)
    assert list(news) == ["N1", "N2"] and news["N1"].abstract_entities == "[]"


@given(st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2100, 12, 31)))
@settings(max_examples=200, deadline=None)
def test_time_format_matches_strptime(moment):
    moment = moment.replace(microsecond=0)
    text = format_time(moment)
    assert parse_time(text) == moment
    assert datetime.strptime(text, MIND_TIME_FORMAT) == moment
    padded = moment.strftime(MIND_TIME_FORMAT)  # zero-padded variant is accepted too
    assert parse_time(padded) == moment


def test_format_time_like_mind():
    assert format_time(datetime(2019, 11, 9, 8, 36, 57)) == "11/9/2019 8:36:57 AM"
    assert format_time(datetime(2019, 11, 9, 0, 5, 0)) == "11/9/2019 12:05:00 AM"
    assert format_time(datetime(2019, 11, 9, 23, 5, 0, 999)) == "11/9/2019 11:05:00 PM"


# ----------------------------------------------------------------------------- validation
def test_news_column_count_error(tmp_path):
    path = write_lines(tmp_path / "news.tsv", [NEWS_LINES[0], "N9\ta\tb\tc\td\te\tf"])
    err = error_of(read_news, path)
    assert err.line == 2
    assert "expected 8 tab-separated columns" in str(err) and "found 7" in str(err)
    assert str(err).startswith(f"{path}:2:")


def test_news_empty_id_error(tmp_path):
    path = write_lines(tmp_path / "news.tsv",
                       [NEWS_LINES[0], NEWS_LINES[1], "\ta\tb\tc\td\te\tf\tg"])
    err = error_of(read_news, path)
    assert err.line == 3 and "empty news id" in str(err)


def test_news_duplicate_id_names_both_lines(tmp_path):
    path = write_lines(tmp_path / "news.tsv", [NEWS_LINES[0], NEWS_LINES[1], NEWS_LINES[2],
                                               NEWS_LINES[1]])
    err = error_of(read_news, path)
    assert err.line == 4
    assert "'N2'" in str(err) and "line 2" in str(err) and "line 4" in str(err)


@pytest.mark.parametrize("line, fragment", [
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1", "expected 5 tab-separated columns"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-1\textra", "found 6"),
    ("5\tU1\t2019-11-11 09:05:58\tN1\tN1-1", "'2019-11-11 09:05:58'"),
    ("5\tU1\t11/11/2019 13:05:58 PM\tN1\tN1-1", "MM/DD/YYYY HH:MM:SS AM"),
    ("5\tU1\t11/31/2019 9:05:58 AM\tN1\tN1-1", "'11/31/2019 9:05:58 AM'"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-1 N2-2", "'N2-2'"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-x", "'N1-x'"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-1 N2", "mix labelled"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\t", "empty candidate list"),
    ("5\tU1\t11/11/2019 9:05:58 AM\tN1\t  ", "empty candidate list"),
    ("5\t\t11/11/2019 9:05:58 AM\tN1\tN1-1", "user id ''"),
    ("\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-1", "impression id ''"),
    ("1\tU1\t11/11/2019 9:05:58 AM\tN1\tN1-1", "duplicate impression id '1'"),
])
def test_behaviors_errors_name_line_and_value(tmp_path, line, fragment):
    path = write_lines(tmp_path / "behaviors.tsv", [BEHAVIOR_LINES[0], BEHAVIOR_LINES[1], line])
    err = error_of(read_behaviors, path)
    assert err.line == 3, str(err)
    assert str(err).startswith(f"{path}:3:")
    assert fragment in str(err), str(err)


def test_bad_time_message_shows_format_and_value(tmp_path):
    path = write_lines(tmp_path / "behaviors.tsv", ["7\tU1\tyesterday\t\tN1-1"])
    message = str(error_of(read_behaviors, path))
    assert "'yesterday'" in message and "MM/DD/YYYY HH:MM:SS AM" in message


def test_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "news.tsv"
    path.write_bytes((NEWS_LINES[0] + "\n").encode() + b"N2\t\xff\tb\tc\td\te\tf\tg\n")
    err = error_of(read_news, path)
    assert err.line == 2 and "UTF-8" in str(err)


# ----------------------------------------------------------------------------- writing
def test_round_trip(tmp_path):
    news = read_news(write_lines(tmp_path / "in" / "news.tsv", NEWS_LINES))
    behaviors = read_behaviors(write_lines(tmp_path / "in" / "behaviors.tsv", BEHAVIOR_LINES))
    write_news(tmp_path / "news.tsv", news)
    write_behaviors(tmp_path / "behaviors.tsv", behaviors)
    assert read_news(tmp_path / "news.tsv") == news
    assert read_behaviors(tmp_path / "behaviors.tsv") == behaviors
    # The written files are the input files, byte for byte.
    assert (tmp_path / "news.tsv").read_bytes() == (tmp_path / "in" / "news.tsv").read_bytes()
    assert ((tmp_path / "behaviors.tsv").read_bytes()
            == (tmp_path / "in" / "behaviors.tsv").read_bytes())


def test_round_trip_real_fragments_byte_identical(tmp_path):
    if not FRAGMENTS.is_dir():
        pytest.skip(f"{FRAGMENTS} is absent")
    news = read_news(FRAGMENTS / "news.tsv")
    behaviors = read_behaviors(FRAGMENTS / "behaviors.tsv")
    assert len(news) == 500 and len(behaviors) == 2000
    write_news(tmp_path / "news.tsv", news)
    write_behaviors(tmp_path / "behaviors.tsv", behaviors)
    assert (tmp_path / "news.tsv").read_bytes() == (FRAGMENTS / "news.tsv").read_bytes()
    assert (tmp_path / "behaviors.tsv").read_bytes() == (FRAGMENTS / "behaviors.tsv").read_bytes()


def test_reading_2000_lines_is_fast():
    if not FRAGMENTS.is_dir():
        pytest.skip(f"{FRAGMENTS} is absent")
    start = _time.perf_counter()
    behaviors = read_behaviors(FRAGMENTS / "behaviors.tsv")
    elapsed = _time.perf_counter() - start
    assert len(behaviors) == 2000
    assert elapsed < 2.0, f"reading 2000 behaviors took {elapsed:.2f} s"


def test_separators_inside_text_become_spaces(tmp_path):
    record = NewsRecord("N1", "cat\tx", "sub", "multi\nline\r\ntitle", "a\tb", "u", "[]", "[]")
    write_news(tmp_path / "news.tsv", [record])
    back = read_news(tmp_path / "news.tsv")["N1"]
    assert back == NewsRecord("N1", "cat x", "sub", "multi line  title", "a b", "u", "[]", "[]")


@pytest.mark.parametrize("impression", [
    Impression("1 2", "U1", datetime(2020, 1, 1), (), ("N1",), (1,)),
    Impression("1", "U 1", datetime(2020, 1, 1), (), ("N1",), (1,)),
    Impression("1", "U1", datetime(2020, 1, 1), ("N 1",), ("N1",), (1,)),
    Impression("1", "U1", datetime(2020, 1, 1), (), ("N1", ""), (1, 0)),
    Impression("1", "U1", datetime(2020, 1, 1), (), (), None),
    Impression("1", "U1", datetime(2020, 1, 1), (), ("N1", "N2"), (1,)),
    Impression("1", "U1", datetime(2020, 1, 1), (), ("N1",), (2,)),
    Impression("1", "U1", datetime(2020, 1, 1), (), ("N-1",), None),
])
def test_write_behaviors_rejects_unrepresentable(tmp_path, impression):
    with pytest.raises(ValueError):
        write_behaviors(tmp_path / "behaviors.tsv", [impression])


def test_write_news_rejects_id_with_space(tmp_path):
    with pytest.raises(ValueError, match="news id"):
        write_news(tmp_path / "news.tsv", [NewsRecord("N 1")])


# ----------------------------------------------------------------------------- missing news
MISSING_BEHAVIORS = [
    "1\tU1\t11/11/2019 9:00:00 AM\tN1 X1 N2\tN1-1 X2-0 N3-0",
    "2\tU2\t11/11/2019 9:01:00 AM\t\tX3-1 N2-0",
    "3\tU1\t11/11/2019 9:02:00 AM\tX1\tX4-0 X5-0",
    "4\tU3\t11/11/2019 9:03:00 AM\tN3\tN1 X2",
    "5\tU3\t11/11/2019 9:04:00 AM\t\tN2-0 N3-0",
]


def test_missing_news_is_an_error_by_default(tmp_path):
    directory = make_split(tmp_path / "d", behaviors=MISSING_BEHAVIORS)
    with pytest.raises(MissingNewsError) as info:
        read_split(directory)
    err = info.value
    assert err.path == str(directory / "behaviors.tsv")
    assert err.missing_count == 5
    assert err.examples == ["X1", "X2", "X3", "X4", "X5"]
    assert err.affected_impressions == 4
    assert "drop-missing" in str(err)


def test_drop_missing_counts_and_result(tmp_path):
    directory = make_split(tmp_path / "d", behaviors=MISSING_BEHAVIORS)
    split = read_split(directory, drop_missing=True)
    assert split.dropped == {"missing_news_ids": 5, "history_references": 2,
                             "candidate_references": 5, "clicks": 1, "impressions": 2}
    t = datetime(2019, 11, 11, 9, 0)
    assert split.behaviors == [
        Impression("1", "U1", t, ("N1", "N2"), ("N1", "N3"), (1, 0)),
        Impression("4", "U3", t.replace(minute=3), ("N3",), ("N1",), None),
        # Labelled without any click to begin with: kept as it is.
        Impression("5", "U3", t.replace(minute=4), (), ("N2", "N3"), (0, 0)),
    ]


def test_nothing_missing_reports_zero_drops(tmp_path):
    split = read_split(make_split(tmp_path / "d"), drop_missing=True)
    assert split.dropped == {"missing_news_ids": 0, "history_references": 0,
                             "candidate_references": 0, "clicks": 0, "impressions": 0}
    assert len(split.behaviors) == 3 and list(split.news) == ["N1", "N2", "N3"]


def test_fragments_missing_references():
    if not FRAGMENTS.is_dir():
        pytest.skip(f"{FRAGMENTS} is absent")
    # Independent count with plain string handling.
    news_ids = {line.split("\t", 1)[0] for line in
                (FRAGMENTS / "news.tsv").read_text(encoding="utf-8").splitlines()}
    referenced = set()
    for line in (FRAGMENTS / "behaviors.tsv").read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        referenced.update(cols[3].split())
        referenced.update(token.rsplit("-", 1)[0] for token in cols[4].split())
    missing = referenced - news_ids
    with pytest.raises(MissingNewsError) as info:
        read_split(FRAGMENTS)
    assert info.value.missing_count == len(missing)
    assert set(info.value.examples) <= missing and len(info.value.examples) == 5
    split = read_split(FRAGMENTS, drop_missing=True)
    assert split.dropped["missing_news_ids"] == len(missing)
    assert split.dropped["impressions"] == 2000 - len(split.behaviors)
    for imp in split.behaviors:
        assert set(imp.history) <= news_ids and set(imp.candidates) <= news_ids
        assert imp.labels is not None and 1 in imp.labels


# ----------------------------------------------------------------------------- layouts
def test_single_split_layout(tmp_path):
    make_split(tmp_path)
    dataset = load_dataset(tmp_path)
    assert dataset.test is None and dataset.path == tmp_path
    assert dataset.train.path == tmp_path and len(dataset.train.behaviors) == 3


def test_train_test_layout_and_write_dataset(tmp_path):
    make_split(tmp_path / "src" / "train")
    make_split(tmp_path / "src" / "test", news=NEWS_LINES[:2],
               behaviors=["9\tU3\t11/12/2019 1:00:00 PM\tN1\tN2-1 N1-0"])
    dataset = load_dataset(tmp_path / "src")
    assert dataset.test is not None and len(dataset.test.behaviors) == 1
    assert list(dataset.test.news) == ["N1", "N2"]
    write_dataset(tmp_path / "out", dataset)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test", "train"]
    again = load_dataset(tmp_path / "out")
    assert again.train.behaviors == dataset.train.behaviors
    assert again.train.news == dataset.train.news
    assert again.test.behaviors == dataset.test.behaviors


def test_train_only_subdirectory(tmp_path):
    make_split(tmp_path / "train")
    dataset = load_dataset(tmp_path)
    assert dataset.test is None and len(dataset.train.behaviors) == 3
    write_dataset(tmp_path / "out", MindDataset(dataset.train, None))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["train"]


def test_layout_errors(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "readme.txt").write_text("x")
    err = error_of(load_dataset, tmp_path)
    assert "news.tsv" in str(err) and "train/" in str(err) and "readme.txt" in str(err)
    err = error_of(load_dataset, tmp_path / "readme.txt")
    assert "is a file" in str(err)
    err = error_of(load_dataset, tmp_path / "nowhere")
    assert "does not exist" in str(err)


def test_missing_file_is_named(tmp_path):
    write_lines(tmp_path / "news.tsv", NEWS_LINES)
    err = error_of(load_dataset, tmp_path)
    assert err.path == str(tmp_path / "behaviors.tsv") and "file not found" in str(err)
    assert split_directories(tmp_path) == {"train": tmp_path, "test": None}


def test_drop_missing_applies_per_split(tmp_path):
    make_split(tmp_path / "train")
    make_split(tmp_path / "test", news=NEWS_LINES[:1],
               behaviors=["9\tU3\t11/12/2019 1:00:00 PM\tN1\tN2-1 N1-0"])
    with pytest.raises(MissingNewsError) as info:
        load_dataset(tmp_path)
    assert info.value.path == str(tmp_path / "test" / "behaviors.tsv")
    dataset = load_dataset(tmp_path, drop_missing=True)
    assert dataset.train.dropped["impressions"] == 0
    assert dataset.test.dropped == {"missing_news_ids": 1, "history_references": 0,
                                    "candidate_references": 1, "clicks": 1, "impressions": 1}
    assert dataset.test.behaviors == []


def test_write_split_into_mindsplit_round_trip(tmp_path):
    split = MindSplit({"A": NewsRecord("A", title="t")},
                      [Impression("i", "u", datetime(2021, 5, 1, 23, 59, 59), ("A", "A"), ("A",),
                                  None)])
    write_dataset(tmp_path, MindDataset(split, None))
    back = read_split(tmp_path / "train")
    assert back.news == split.news and back.behaviors == split.behaviors
