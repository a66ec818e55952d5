"""The operator's side of the write API: add or update articles of a server's news pool.

:class:`NewsWriter` POSTs articles to ``/v1/news`` in batches of at most
:data:`~.schemas.MAX_NEWS_PER_REQUEST`, each with ``Authorization: Bearer TOKEN`` (the token
the server was started with, docs/serving.md#security), and waits out a 429 as its
``Retry-After`` says. Devices never write: this is for the operator's ingestion jobs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from privaterec.data.records import NewsRecord
from privaterec.serving.schemas import MAX_NEWS_PER_REQUEST
from privaterec.serving.store import article_json
from privaterec.serving.transport import (HttpClient, HttpSession, Transport, json_body,
                                          json_of, raise_for_status)
from privaterec.serving.write_api import check_token


class NewsWriter(HttpClient):
    """Adds articles to the news pool of a server through its write API.

    Parameters
    ----------
    base_url:
        The server (unused when ``transport`` is given).
    token:
        The server's write token (keyword-only; never printed).
    transport:
        An httpx-compatible client (default ``httpx.Client(base_url)``).
    timeout:
        Seconds per request of the default client (the server encodes each batch).
    max_waits:
        429 answers waited out per batch before giving up.
    sleep:
        How to wait (for tests).
    """

    def __init__(self, base_url: str | None = None, *, token: str,
                 transport: Transport | None = None, timeout: float = 600.0,
                 max_waits: int = 10, sleep: Callable[[float], None] = time.sleep) -> None:
        self._auth = f"Bearer {check_token(token, source='NewsWriter(token=...)')}"
        self._http = HttpSession(base_url, transport, timeout)
        self.max_waits = max_waits
        self.sleep = sleep

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return "NewsWriter(token=<hidden>)"

    def add(self, articles: Sequence[NewsRecord]) -> dict[str, int]:
        """POST ``articles`` (new ids are added, known ids updated).

        Returns
        -------
        ``{"added", "updated", "num_news"}`` summed over the batches (``num_news``: the
        pool's size after the last one).

        Raises
        ------
        ServerError
            The server refused a batch (401/403: token; 422: an article; 429 too often).
        """
        total = {"added": 0, "updated": 0, "num_news": 0}
        for lo in range(0, len(articles), MAX_NEWS_PER_REQUEST):
            batch = articles[lo:lo + MAX_NEWS_PER_REQUEST]
            answer = self._post(json_body({"news": [article_json(a) for a in batch]}))
            total["added"] += int(answer["added"])
            total["updated"] += int(answer["updated"])
            total["num_news"] = int(answer["num_news"])
        return total

    def _post(self, body: bytes) -> dict[str, Any]:
        headers = {"content-type": "application/json", "authorization": self._auth}
        for _ in range(self.max_waits + 1):
            response = self._http.send_raw("POST", "/v1/news", body, headers)
            if response.status_code != 429:
                break
            self.sleep(float(response.headers.get("retry-after", "1")))
        return json_of(raise_for_status(response, "POST", "/v1/news"), "POST", "/v1/news")


__all__ = ["NewsWriter"]
