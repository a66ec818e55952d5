"""The README's two commands are the ones CI and users run: keep them true."""

import json
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert first_block, "README.md must start with a code block of the two commands"
    return [line.strip() for line in first_block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_readme_starts_with_exactly_two_commands():
    commands = _readme_commands()
    assert len(commands) == 2
    assert commands[0].endswith("privaterec demo")
    assert "pytest" in commands[1]


def test_install_commands_show_progress():
    # `pip install -q` would leave the first command silent for minutes
    for command in _readme_commands():
        install = command.split("&&")[1]
        assert "pip install" in install and " -q" not in install, command


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci


def _torch_requirement(requirements: list[str]) -> Requirement:
    found = [Requirement(r) for r in requirements if Requirement(r).name == "torch"]
    assert len(found) == 1, requirements
    return found[0]


def _is_a_range_with_the_cpu_build(requirement: Requirement) -> None:
    operators = {spec.operator for spec in requirement.specifier}
    assert operators == {">=", "<"}, f"torch must be a range, not {requirement}"
    assert requirement.specifier.contains("2.13.0")  # the CPU build CI installs
    assert not requirement.specifier.contains("3.0")


def test_torch_is_a_range_and_the_commands_install_the_cpu_build():
    # A pin forced pip to replace an installed CUDA PyTorch; the range keeps it. With no
    # torch installed, the range alone would let pip pick a newer (CUDA) build, so each
    # command asks for the CPU build 2.13.0 in the same pip call (docs/gpu.md, Installing).
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    _is_a_range_with_the_cpu_build(_torch_requirement(pyproject["project"]["dependencies"]))
    for command in _readme_commands():
        install = command.split("&&")[1].split()
        assert "torch==2.13.0" in install and "-e" in install, command


def test_the_installed_metadata_requires_a_torch_range():
    try:
        distribution = metadata.distribution("privaterec")
    except metadata.PackageNotFoundError:
        pytest.skip("privaterec is not installed (PYTHONPATH=src)")
    origin = json.loads(distribution.read_text("direct_url.json") or "{}").get("url", "")
    located = Path(str(distribution.locate_file(""))).resolve()
    if origin != ROOT.as_uri() and not located.is_relative_to(ROOT):
        pytest.skip(f"the installed privaterec comes from {origin or located}, not this "
                    f"checkout: its metadata need not match this checkout's pyproject.toml")
    _is_a_range_with_the_cpu_build(_torch_requirement(distribution.requires or []))


def _readme_quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README.md's Quickstart must hold a python code block"
    return block.group(1)


def test_readme_quickstart_is_short_and_uses_the_top_level_api():
    code = _readme_quickstart()
    assert len(code.splitlines()) <= 20
    assert code.startswith("import privaterec\n")
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


@pytest.mark.slow
def test_readme_quickstart_runs(tmp_path):
    # the README's Python block, as written, in a fresh directory and a fresh interpreter
    import os
    import subprocess
    import sys

    (tmp_path / "quickstart.py").write_text(_readme_quickstart())
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    auc = float(lines[0])
    epsilon, delta = map(float, lines[1].split())
    assert 0.0 <= auc <= 1.0
    assert 0.9 <= epsilon <= 1.0 and delta == 1e-5  # calibrated to the target ε = 1
    assert "user-level" in done.stdout
    local_auc, sent = lines[-1].split()
    assert float(local_auc) == auc and sent == "0"  # local ranking: the model's own AUC
    assert (tmp_path / "runs" / "dp" / "privacy.json").exists()


def test_import_privaterec_loads_no_model_code():
    # `privaterec --help` and `import privaterec` must not pay for torch
    import subprocess
    import sys

    code = ("import sys, privaterec\n"
            "assert callable(privaterec.train) and privaterec.__version__\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
