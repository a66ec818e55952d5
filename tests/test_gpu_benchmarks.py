"""The GPU benchmark and check script run (their ``--smoke`` settings, on the CPU here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.mark.slow
def test_gpu_round_speed_smoke_measures_both_rounds(tmp_path):
    out = tmp_path / "speed.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_round_speed.py"), "--smoke",
                    "--devices", "cpu", "--models", "default", "--out", str(out)],
                   check=True, env=_env(), capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    rows = {row["method"]: row for row in result["rows"]}
    assert set(rows) == {"fedrec", "dp-fedavg"}
    for row in rows.values():
        assert row["device"] == "cpu" and row["clients"] == 20
        assert row["round_s"] == pytest.approx(row["inputs_s"] + row["compute_s"])
        assert row["clients_per_s"] == pytest.approx(20 / row["round_s"])
    assert rows["dp-fedavg"]["dp_over_plain_round"] > 0


def test_gpu_check_script_parses_and_refuses_unknown_arguments(tmp_path):
    script = ROOT / "benchmarks/gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    done = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr
