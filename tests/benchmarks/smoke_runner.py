"""Run several ``benchmarks/*.py --smoke`` one after the other in this one process.

Usage::

    python tests/benchmarks/smoke_runner.py OUTCOMES.json WORKDIR NAME [NAME ...]

Importing torch and privaterec costs a subprocess about 5 CPU-seconds; running every
benchmark's smoke in one interpreter pays it once. Each script runs as ``python
benchmarks/NAME --smoke`` would run it (``runpy`` with ``__name__ == "__main__"``,
``sys.argv == [path, "--smoke"]``, the benchmarks folder first on ``sys.path``), in its own
working directory ``WORKDIR/NAME`` that is also its ``TMPDIR`` and ``HOME``; its output
(both file descriptors, so its own subprocesses' too) goes to ``WORKDIR/NAME/output.log``.
Between scripts the process's state is put back as it was: working directory, environment,
``sys.argv``/``sys.path``, torch's thread count and random states, and every attribute of
an already imported ``privaterec`` module (a script may wrap a function for timing).

After every script ``OUTCOMES.json`` is rewritten with one entry per script run so far:
``{"ok": bool, "error": str, "seconds": float, "results_written": [paths]}`` (paths under
``benchmarks/results`` created, modified or removed by the run, which a smoke must never do). A
script that never got an entry was not reached: the runner died (its stderr says how).
"""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT = 600
"""Seconds one script may run."""


def results_snapshot() -> dict[str, float]:
    """Every file under ``benchmarks/results`` and its modification time."""
    results = BENCHMARKS / "results"
    return {str(p.relative_to(results)): p.stat().st_mtime for p in results.rglob("*")
            if p.is_file()}


class _Timeout(BaseException):
    """Raised in the main thread when a script runs past :data:`TIMEOUT` (a BaseException,
    so that a script's ``except Exception`` does not swallow it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout(f"still running after {TIMEOUT} s")


def _module_state() -> dict[str, dict[str, Any]]:
    return {name: dict(vars(module)) for name, module in list(sys.modules.items())
            if module is not None and (name == "privaterec" or name.startswith("privaterec."))}


def _restore_modules(saved: dict[str, dict[str, Any]]) -> None:
    for name, attributes in saved.items():
        namespace = vars(sys.modules[name])
        for key in [key for key in namespace if key not in attributes]:
            del namespace[key]
        for key, value in attributes.items():
            if key not in namespace or namespace[key] is not value:
                namespace[key] = value


def run_one(name: str, workdir: Path) -> dict[str, Any]:
    """Run ``benchmarks/NAME --smoke`` in this process; its outcome (see the module's doc)."""
    import numpy as np
    import torch

    here = workdir / name
    here.mkdir(parents=True, exist_ok=True)
    script = BENCHMARKS / name
    saved = dict(cwd=os.getcwd(), env=dict(os.environ), argv=list(sys.argv),
                 path=list(sys.path), threads=torch.get_num_threads(),
                 torch_rng=torch.get_rng_state(), np_rng=np.random.get_state(),
                 py_rng=random.getstate(), modules=_module_state(),
                 handlers={sig: signal.getsignal(sig) for sig in (signal.SIGINT,
                                                                  signal.SIGTERM)})
    before = results_snapshot()
    log = open(here / "output.log", "wb")  # noqa: SIM115 - closed in finally
    sys.stdout.flush()
    sys.stderr.flush()
    fds = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.chdir(here)
    os.environ.update(TMPDIR=str(here), HOME=str(here))
    tempfile.tempdir = None  # re-read TMPDIR
    sys.argv = [str(script), "--smoke"]
    sys.path.insert(0, str(BENCHMARKS))
    ok, error, start = False, "", time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TIMEOUT)
    try:
        runpy.run_path(str(script), run_name="__main__")
        ok = True
    except SystemExit as stop:
        ok = stop.code in (None, 0)
        error = "" if ok else f"exited with {stop.code!r}"
    except BaseException:  # noqa: BLE001 - every failure is the script's outcome
        error = traceback.format_exc()
    finally:
        signal.alarm(0)
        seconds = time.perf_counter() - start
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        log.close()
        os.chdir(saved["cwd"])
        os.environ.clear()
        os.environ.update(saved["env"])
        tempfile.tempdir = None
        sys.argv, sys.path[:] = saved["argv"], saved["path"]
        torch.set_num_threads(saved["threads"])
        torch.set_rng_state(saved["torch_rng"])
        np.random.set_state(saved["np_rng"])
        random.setstate(saved["py_rng"])
        _restore_modules(saved["modules"])
        for sig, handler in saved["handlers"].items():
            signal.signal(sig, handler)
    after = results_snapshot()
    written = sorted(path for path in before.keys() | after.keys()
                     if before.get(path) != after.get(path))
    output = (here / "output.log").read_bytes().decode(errors="replace")
    return {"ok": ok, "error": error, "seconds": round(seconds, 2),
            "results_written": written, "output_tail": output[-3000:]}


def main(argv: list[str]) -> int:
    out, workdir, names = Path(argv[0]), Path(argv[1]), argv[2:]
    outcomes: dict[str, Any] = {}
    for name in names:
        outcomes[name] = run_one(name, workdir)
        out.write_text(json.dumps(outcomes, indent=1))
        print(name, "ok" if outcomes[name]["ok"] else "FAILED",
              outcomes[name]["seconds"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
