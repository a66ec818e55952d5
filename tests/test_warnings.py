"""The pytest warning filters silence dependencies' deprecations only."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# In a fresh interpreter: every warning is an error, then pyproject's filters are applied
# the way pytest applies them, then starlette's TestClient (via FastAPI) is imported.
_PROBE = """
import sys, warnings
from _pytest.config import parse_warning_filter
warnings.simplefilter("error")
for spec in sys.argv[1:]:
    warnings.filterwarnings(*parse_warning_filter(spec, escape=False))
import fastapi.testclient  # noqa: F401  (starlette.testclient)
try:
    warnings.warn("ours", DeprecationWarning)
except DeprecationWarning:
    print("own deprecations still raise")
"""


def _filters() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["pytest"]["ini_options"].get("filterwarnings", [])


def test_dependency_deprecation_is_filtered_and_ours_is_not():
    filters = _filters()
    assert all(f.startswith("ignore:") and ":DeprecationWarning:" in f for f in filters)
    result = subprocess.run([sys.executable, "-c", _PROBE, *filters], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "own deprecations still raise" in result.stdout
