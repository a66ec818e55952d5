"""The README's two commands are the ones CI and users run: keep them true."""

import re
from pathlib import Path

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


def test_install_never_pulls_an_unpinned_torch():
    pyproject = (ROOT / "pyproject.toml").read_text()
    torch_requirements = re.findall(r'"torch[^"]*"', pyproject)
    assert torch_requirements == ['"torch==2.13.0"']
