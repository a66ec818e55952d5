"""docs/quickstart.md runs as written: every fenced block, in order, in a fresh directory."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "quickstart.md"


def quickstart_blocks(text: str) -> list[tuple[str, str]]:
    """The ``bash`` and ``python`` fenced blocks of ``text``, in order, as (language, code)."""
    return re.findall(r"^```(bash|python)\n(.*?)^```", text, re.S | re.M)


def quickstart_script(text: str, port: int) -> str:
    """One bash script: bash blocks as they are, python blocks through ``python -``."""
    lines = ["set -euo pipefail",
             "trap 'if [ -f server.pid ]; then kill \"$(cat server.pid)\" 2>/dev/null || true; fi'"
             " EXIT"]
    for language, code in quickstart_blocks(text):
        code = code.replace("8765", str(port))
        lines.append(code if language == "bash" else f"python - <<'PYEOF'\n{code}PYEOF")
    return "\n".join(lines) + "\n"


def test_the_quickstart_covers_the_tutorial():
    blocks = quickstart_blocks(DOC.read_text())
    code = "\n".join(c for _, c in blocks)
    for step in ("privaterec data synth", "privaterec data check", "--method dp-fedavg",
                 "--target-epsilon", "privaterec privacy report", "privaterec serve",
                 "--serving local", "PrivateRecDevice", "LocalRankingDevice",
                 "/v1/recommend/privaterec"):
        assert step in code, step
    assert [lang for lang, _ in blocks].count("python") >= 3


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "quickstart.sh"
    script.write_text(quickstart_script(DOC.read_text(), port))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRIVATEREC_DEVICE_DIR": str(tmp_path / "device-state")}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    out = done.stdout
    assert "VALID" in out and "user-level epsilon" in out
    assert re.search(r"sent \d+ bytes; this device spent epsilon 1\.0", out), out[-2000:]
    assert "sent 0 bytes about the user" in out
    assert (tmp_path / "runs" / "dp" / "privacy.json").exists()
