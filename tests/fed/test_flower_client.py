"""The ClientApp of ``flwr run flower/`` (:mod:`privaterec.apps.flower_client`): a SuperNode
starts a process per message, so SecAgg+'s key stages must not import the device's code."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("flwr", reason="the ClientApp needs flwr")

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import (  # noqa: E402
    RECORD_KEY_CONFIGS, Key, Stage)

from privaterec.apps import flower_client  # noqa: E402


pytestmark = pytest.mark.usefixtures("flower_task_identity")


def test_importing_the_client_app_imports_no_torch():
    code = ("import sys, privaterec.apps.flower_client\n"
            "assert 'torch' not in sys.modules and 'dp_accounting' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_it_answers_every_message_type_the_device_handlers_do():
    from privaterec.fed.flower.client_app import make_client_app

    assert (flower_client.client_app._registered_funcs.keys()
            == make_client_app(lambda spec: None)._registered_funcs.keys())


def _message(stage: str | None) -> Message:
    records: dict[str, Any] = {}
    if stage is not None:
        records[RECORD_KEY_CONFIGS] = ConfigRecord({Key.STAGE: stage})
    return Message(RecordDict(records), dst_node_id=7, message_type=MessageType.TRAIN)


@pytest.mark.parametrize("stage, path", [
    (Stage.SETUP, "mod"), (Stage.SHARE_KEYS, "mod"), (Stage.UNMASK, "mod"),
    (Stage.COLLECT_MASKED_VECTORS, "device"), (None, "device")])
def test_only_the_stage_with_a_vector_reaches_the_device(monkeypatch, stage, path):
    taken: list[str] = []

    class Handlers:
        @staticmethod
        def handle_train(load: Any, message: Message, context: Context) -> Message:
            taken.append("device")
            return message

    def mod(message: Message, context: Context, call_next: Any) -> Message:
        taken.append("mod")
        with pytest.raises(AssertionError):
            call_next(message, context)
        return message

    monkeypatch.setattr(flower_client, "_handle", lambda handler, message, context:
                        getattr(Handlers, handler)(None, message, context))
    monkeypatch.setattr(flower_client, "secaggplus_mod", mod)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    flower_client.client_app(message=_message(stage), context=context)
    assert taken == [path]
