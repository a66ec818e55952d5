"""``privaterec data synth`` for people: every flag has help with its default, and the
summary prints as text, never as Python dict reprs."""

from __future__ import annotations

import json
import re

from privaterec.cli import build_parser, main
from privaterec.data.synth import SynthConfig


def test_every_synth_flag_has_help_and_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    data_sub = next(a for a in sub.choices["data"]._actions if a.choices and "synth" in a.choices)
    synth = data_sub.choices["synth"]
    defaults = SynthConfig()
    for action in synth._actions:
        if action.dest == "help":
            continue
        assert action.help, f"--{action.dest} has no help text"
        if action.dest in ("users", "news", "topics", "days", "seed"):
            assert f"(default {getattr(defaults, action.dest)})" in action.help, action.help
        elif not action.required:
            assert "default" in action.help, action.help


def test_synth_prints_a_text_summary_without_dict_reprs(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path / "d"), "--users", "30",
                 "--news", "80"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"[{}]|\[|\]|': ", out), out
    assert "users: 30, news: 80" in out and "settings: users=30 news=80" in out
    assert re.search(r"^impressions\s+\d+\s+\d+$", out, re.M)  # the splits as a table
    assert main(["data", "synth", "--out", str(tmp_path / "j"), "--users", "30",
                 "--news", "80", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["users"] == 30
