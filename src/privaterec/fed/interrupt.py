"""Ctrl-C during a training whose rounds run in other threads and processes (Flower's
simulation runtime: the ServerApp in a thread, the ClientApps in Ray workers).

Python delivers SIGINT to the main thread only, where Flower runs its simulation runtime,
while the rounds wait for replies in the ServerApp's thread. :func:`sigint_sets` turns the
signal into an event instead of an exception; :func:`stop_grid_on` makes every call of the
server on its Grid raise :class:`RoundInterrupted` once the event is set, so the ServerApp
leaves its round at once (:func:`~privaterec.fed.simulator.train_federated` checkpoints the
rounds it completed), the runtime shuts down, and the caller raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

EXIT_INTERRUPTED = 130


class RoundInterrupted(Exception):
    """The training was interrupted (Ctrl-C) while the server waited for its clients."""


def stop_grid_on(grid: Any, stop: threading.Event) -> None:
    """Make ``grid`` (a Flower Grid) raise :class:`RoundInterrupted` from every call that
    sends, receives or lists nodes once ``stop`` is set; its waits poll these calls."""
    for name in ("push_messages", "pull_messages", "get_node_ids"):
        call = getattr(grid, name)

        def checked(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
            if stop.is_set():
                raise RoundInterrupted("interrupted")
            return _call(*args, **kwargs)

        setattr(grid, name, checked)


@contextlib.contextmanager
def sigint_sets(*events: threading.Event, quiet: tuple[str, ...] = ("flwr", "ray")
                ) -> Iterator[None]:
    """Within the block, Ctrl-C sets ``events`` (and silences the ``quiet`` loggers, whose
    workers die of the same signal) instead of raising ``KeyboardInterrupt``; a second
    Ctrl-C exits the process at once with status 130. Outside the main thread (where no
    signal handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if all(event.is_set() for event in events):  # asked twice: leave now, the last
            os._exit(EXIT_INTERRUPTED)  # checkpoint stays as it is
        for event in events:
            event.set()
        for name in quiet:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


__all__ = ["EXIT_INTERRUPTED", "RoundInterrupted", "sigint_sets", "stop_grid_on"]
