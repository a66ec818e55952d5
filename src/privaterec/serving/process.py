"""``privaterec serve`` on loopback for demos, end-to-end tests and benchmarks.

:class:`ServerProcess` starts the server in a subprocess and waits for ``GET /v1/health``;
:func:`demo_query` starts one, makes one private PrivateRec query through a
:class:`~privaterec.serving.device.PrivateRecDevice` (α̃ [B] and k are all that is sent) and
stops it; :func:`free_port` picks a loopback port. The demo's device is set up as a real one:
its noise comes from the OS CSPRNG (no seed), so the α̃ it prints differs from run to run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx

from privaterec.data.records import NewsRecord
from privaterec.serving.device import PrivateRecDevice
from privaterec.serving.transport import ServerError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``privaterec serve`` in a subprocess on loopback, for demos, tests and benchmarks.

    Use as a context manager; the server's output goes to ``log_path`` (by default a
    temporary file, deleted on stop) and is quoted in the error when it fails to start.

    Parameters
    ----------
    run, news:
        ``--run`` and ``--news`` of ``privaterec serve``.
    host, port:
        Where to listen (default: a free loopback port).
    store:
        ``--store`` (default: the server's choice).
    write_token_file:
        ``--write-token-file`` (the write API's token); ``None``: ``--no-ingest`` (a
        read-only server).
    extra_args:
        More command-line arguments for ``privaterec serve``.
    env:
        Extra environment variables (``OMP_NUM_THREADS=1`` unless set).
    startup_timeout:
        Seconds to wait for ``GET /v1/health``.
    """

    def __init__(self, run: str | Path, news: str | Path, *, host: str = "127.0.0.1",
                 port: int | None = None, store: str | Path | None = None,
                 write_token_file: str | Path | None = None, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 startup_timeout: float = 120.0, log_path: str | Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.command = [sys.executable, "-m", "privaterec.cli", "serve", "--run", str(run),
                        "--news", str(news), "--host", host, "--port", str(self.port),
                        *(["--store", str(store)] if store is not None else []),
                        *(["--write-token-file", str(write_token_file)]
                          if write_token_file is not None else ["--no-ingest"]), *extra_args]
        self.env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    **(env or {})}
        self.startup_timeout = startup_timeout
        self._own_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="privaterec-serve-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.process: subprocess.Popen[bytes] | None = None
        self.health: dict[str, Any] | None = None

    def start(self) -> ServerProcess:
        """Start the server and wait until ``/v1/health`` answers (raise with its log if not)."""
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                        env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    tail = self.log_tail()
                    self.stop()
                    raise ServerError("GET", "/v1/health", 0,
                                      f"'privaterec serve' exited with code "
                                      f"{self.process.returncode}: {tail}")
                try:
                    response = client.get("/v1/health")
                    if response.status_code == 200:
                        self.health = response.json()
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise ServerError("GET", "/v1/health", 0,
                          f"no answer within {self.startup_timeout:g} s: {tail}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _demo_history(news: str | Path, size: int) -> list[NewsRecord]:
    """A user history for the demo: a test (else train) user's clicks, else the first news."""
    from privaterec.data.mind import load_dataset, read_news

    path = Path(news)
    if path.is_dir():
        dataset = load_dataset(path)
        pool = dataset.all_news()
        for split in (dataset.test, dataset.train):
            for impression in (split.behaviors if split is not None else []):
                ids = [i for i in impression.history if i in pool]
                if ids:
                    return [pool[i] for i in ids[-size:]]
        return list(pool.values())[:size]
    return list(read_news(path).values())[:size]


def demo_query(run_dir: str | Path, news: str | Path, *, epsilon: float,
               padding_p: float = 0.5, k: int = 10, history: Sequence[NewsRecord] | None = None,
               history_size: int = 10, store: str | Path | None = None,
               host: str = "127.0.0.1", port: int | None = None,
               device_dir: str | Path | None = None) -> dict[str, Any]:
    """Start ``privaterec serve`` on loopback, make one private PrivateRec query, stop it.

    Parameters
    ----------
    run_dir, news:
        A PrivateRec run directory and the news to serve (MIND directory or news TSV).
    epsilon, padding_p:
        ε_s and p of the release (Laplace).
    k:
        Results to ask for.
    history:
        The user's read news (default: the first user history found in ``news``).
    history_size:
        Length of the default history.
    store, host, port:
        Passed to :class:`ServerProcess`.
    device_dir:
        The demo device's ``cache_dir`` (ledger, release cache, parameters). Default: a
        temporary directory, deleted afterwards — the demo plays a new user each run and
        never spends from the budget kept in your own device state directory.

    Returns
    -------
    ``{"url", "model_version", "history": [news ids, kept on the device], "sent": {"alpha",
    "k"}, "bytes_sent", "basis_size", "epsilon_spent", "received": [items]}``.
    """
    records = list(history) if history is not None else _demo_history(news, history_size)
    with tempfile.TemporaryDirectory(prefix="privaterec-demo-device-") as tmp, \
            ServerProcess(run_dir, news, host=host, port=port, store=store) as server:
        # Set up as on a real device: the default randomness (SecureNoise, the OS CSPRNG),
        # the default finite budget, a persistent ledger in the device's directory.
        with PrivateRecDevice(server.url, epsilon=epsilon, padding_p=padding_p,
                              cache_dir=device_dir if device_dir is not None else tmp
                              ) as device:
            items = device.recommend(records, k=k)
            assert device.last_query is not None
            return {"url": server.url, "model_version": device.model_version,
                    "history": [n.news_id for n in records], "sent": device.last_query["sent"],
                    "bytes_sent": device.bytes_sent, "basis_size": device.basis_size,
                    "epsilon_spent": device.spent(), "received": items}


__all__ = ["ServerProcess", "demo_query", "free_port"]
