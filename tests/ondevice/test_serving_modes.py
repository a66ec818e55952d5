"""The serving modes are declared once (privaterec.ondevice.release.SERVING_MODES): the CLI,
the configuration's checks, the recall methods, the server's query bodies and the device SDK
all derive from the registry."""

from __future__ import annotations

import argparse
import math

import pytest

from privaterec.errors import ConfigError
from privaterec.ondevice.release import (QUERY_MODES, SERVING_KINDS, SERVING_MODES,
                                         ServingConfig, serving_event)


def _evaluate_choices(flag: str) -> tuple[str, ...]:
    from privaterec.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    evaluate = sub.choices["evaluate"]
    action = next(a for a in evaluate._actions if flag in a.option_strings)
    return tuple(action.choices)


def test_cli_serving_choices_are_the_registry():
    assert _evaluate_choices("--serving") == tuple(SERVING_MODES) == SERVING_KINDS
    assert set(SERVING_KINDS) == {"none", "privaterec", "vdp", "local"}


def test_recall_methods_take_every_mode_that_sends_a_query():
    from privaterec.recall.evaluate import RECALL_METHODS

    assert QUERY_MODES == tuple(n for n, m in SERVING_MODES.items() if m.endpoint)
    assert QUERY_MODES == ("privaterec", "vdp")
    assert _evaluate_choices("--recall") == ("unifedrec", "youtubenet", "no-bie", *QUERY_MODES)
    assert set(RECALL_METHODS) == {"unifedrec", "no-bie", "youtubenet", *QUERY_MODES}


def test_server_has_one_query_body_per_mode_that_sends():
    from privaterec.serving.schemas import request_models

    bodies = request_models(basis_size=3, dim=4)
    assert tuple(bodies.query) == QUERY_MODES
    for name, body in bodies.query.items():
        mode = SERVING_MODES[name]
        width = mode.width(basis_size=3, dim=4)
        values = [1 / width] * width
        assert getattr(body(**{mode.field: values}), mode.field) == values
        with pytest.raises(ValueError):  # the exact length the served model needs
            body(**{mode.field: values + [0.0]})
    with pytest.raises(ValueError, match="alpha"):  # privaterec's release is on the simplex
        bodies.query["privaterec"](alpha=[1.0, 1.0, 1.0])


def test_config_checks_follow_the_mode():
    with pytest.raises(ConfigError, match="serving"):
        ServingConfig(kind="nope")
    with pytest.raises(ConfigError, match="epsilon_serve"):  # local takes no ε_s
        ServingConfig(kind="local", epsilon=1.0)
    assert ServingConfig(kind="privaterec", epsilon=1.0).effective_padding == 0.5
    assert ServingConfig(kind="vdp", epsilon=1.0).effective_padding == 0.0
    assert ServingConfig(kind="privaterec").effective_padding == 0.0  # ε_s = ∞: no padding


def test_each_mode_declares_its_accounting():
    for name, mode in SERVING_MODES.items():
        config = ServingConfig(kind=name, epsilon=2.0 if mode.takes_epsilon else math.inf)
        event = serving_event(config, basis_size=5, dim=8)
        assert event.phase == "serve"
        expected = (0.0 if not mode.takes_epsilon else 2.0 if mode.endpoint else math.inf)
        assert event.epsilon == pytest.approx(expected)


def test_a_device_needs_a_mode_that_sends_a_query():
    from privaterec.serving.device import ServingDevice

    for name in set(SERVING_KINDS) - set(QUERY_MODES):
        with pytest.raises(ConfigError, match="sends no query"):
            ServingDevice(None, ServingConfig(kind=name))
