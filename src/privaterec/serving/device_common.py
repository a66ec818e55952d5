"""What every device of the SDK shares: the server session, the downloaded model, the checks.

The devices that query the server with a private release (:mod:`privaterec.serving.device`)
and the device that ranks the downloaded pool itself (:mod:`privaterec.serving.local_device`)
are all a :class:`DeviceBase`: an HTTP session to the server (:class:`HttpSession`) and the
public ranking model downloaded from ``GET /v1/model`` (:func:`download_model`), downloaded
again when the server announces a new ``model_version``. A subclass checks the announcement
(:meth:`DeviceBase._check_info`) and may download more with the model
(:meth:`DeviceBase._download`).

The user's history (:class:`~privaterec.data.records.NewsRecord` s) never leaves a device;
:func:`check_history` and :func:`check_count` validate a query's arguments before anything is
computed or sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from privaterec.data.records import NewsRecord
from privaterec.errors import ConfigError
from privaterec.serving.download import DeviceModel, download_model
from privaterec.serving.schemas import MAX_K
from privaterec.serving.transport import HttpClient, HttpSession, Transport


def check_history(history: Sequence[NewsRecord]) -> list[NewsRecord]:
    """``history`` as a list, or a :class:`ConfigError` unless it is a sequence of
    :class:`NewsRecord` (the news this user read, held on the device)."""
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise ConfigError("'history' must be a sequence of NewsRecord (the news this user "
                          "read, held on the device)")
    items = list(history)
    for i, n in enumerate(items):
        if not isinstance(n, NewsRecord):
            raise ConfigError(f"history[{i}] is a {type(n).__name__}, expected a NewsRecord: "
                              f"the device encodes the news it holds and never sends ids")
    return items


def check_count(value: int, name: str, upper: int, *, why: str = "") -> int:
    """``value`` if it is an integer in [1, ``upper``], else a :class:`ConfigError` naming
    ``name`` (and ``why``, the reason for the bound, when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise ConfigError(f"invalid '{name}': got {value!r}, expected an integer in "
                          f"[1, {upper}]" + (f" ({why})" if why else ""))
    return value


class DeviceBase(HttpClient):
    """A device's session with the server and the public model it downloaded.

    A subclass calls ``super().__init__`` once its own arguments are checked, then
    :meth:`refresh` to download the model.

    Parameters
    ----------
    base_url:
        The server, e.g. ``"http://127.0.0.1:8000"`` (or pass ``transport``).
    cache_dir:
        Keeps the downloaded parameters (and whatever the subclass keeps) across restarts;
        ``~`` is expanded.
    transport, timeout:
        An httpx-compatible client (default ``httpx.Client(base_url)``), seconds per request.
    """

    _model: DeviceModel

    def __init__(self, base_url: str | None, *, cache_dir: str | Path | None,
                 transport: Transport | None, timeout: float) -> None:
        self.cache_dir = None if cache_dir is None else Path(cache_dir).expanduser()
        self._http = HttpSession(base_url, transport, timeout)

    def refresh(self) -> None:
        """(Re)download ``/v1/model`` and, if its version is new, the parameters."""
        info = self._http.get_json("/v1/model")
        self._check_info(info)
        current: DeviceModel | None = getattr(self, "_model", None)
        if current is None or current.model_version != info["model_version"]:
            self._download(info)

    def _check_info(self, info: Mapping[str, Any]) -> None:
        """Refuse (:class:`ConfigError`) a served model this device cannot use."""

    def _download(self, info: Mapping[str, Any]) -> None:
        """Download the model that ``info`` announces (:func:`download_model`)."""
        self._model = download_model(self._http, info, self.cache_dir)

    @property
    def model(self) -> DeviceModel:
        """The downloaded public ranking model."""
        return self._model

    @property
    def model_version(self) -> str:
        """The server's version of :attr:`model`."""
        return self._model.model_version


__all__ = ["DeviceBase", "MAX_K", "check_count", "check_history"]
