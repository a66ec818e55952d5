"""docs/serving.md's snippets run as written: the user's ``history`` from one's own data."""

from __future__ import annotations

import re
from pathlib import Path

from privaterec.data.mind import write_news
from privaterec.data.records import NewsRecord
from privaterec.serving.client import PrivateRecDevice

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tested: tests/serving/test_docs_snippets.py -->"


def _snippet() -> str:
    text = (ROOT / "docs" / "serving.md").read_text()
    match = re.search(re.escape(MARKER) + r"\n```python\n(.*?)```", text, re.S)
    assert match, f"docs/serving.md must hold a python block right after {MARKER}"
    return match.group(1)


def test_the_history_snippet_builds_a_history_a_device_accepts(served_app, tmp_path,
                                                               monkeypatch):
    catalogue = [NewsRecord("N1001", "sports", "golf", "Rain delays the final round",
                            "Play resumes tomorrow."),
                 NewsRecord("N1002", "finance", "markets", "Markets close higher", ""),
                 NewsRecord("N1003", "travel", "", "Unread article", "")]
    write_news(tmp_path / "news.tsv", catalogue)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_snippet(), "docs/serving.md", "exec"), scope)  # noqa: S102 - our own docs
    history = scope["history"]
    assert [n.news_id for n in history] == ["N1001", "N1002"]
    assert history == [catalogue[0], catalogue[1]]
    device = PrivateRecDevice(epsilon=1.0, transport=served_app, cache_dir=tmp_path / "dev")
    items = device.recommend(history, k=3)
    assert len(items) == 3
    sent = device.last_query["sent"]
    assert set(sent) == {"alpha", "k"} and "N1001" not in str(sent)
