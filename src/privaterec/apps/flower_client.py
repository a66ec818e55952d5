"""The ClientApp of ``flwr run flower/`` (``flower/pyproject.toml``, docs/flower.md).

A SuperNode runs every message it receives in a fresh ``flwr-clientapp`` process, which
imports this module: it imports Flower only, and a message imports the device's code
(torch, the model, the privacy ledger: several seconds of CPU per process) only when it
uses it.

* ``query``, ``train`` and ``evaluate`` —
  :func:`privaterec.fed.flower.client_app.client_query`,
  :func:`~privaterec.fed.flower.client_app.handle_train` and
  :func:`~privaterec.fed.flower.client_app.client_evaluate` with the run layer's device loader
  (:func:`privaterec.runs.engines.load_device`), as
  :func:`~privaterec.fed.flower.client_app.make_client_app` builds them;
* SecAgg+'s setup, share-keys and unmask stages — Flower's ``secaggplus_mod`` alone: they
  advertise the round's keys, share them and reveal the shares that unmask the sum (SecAgg+,
  Bell et al. 2020: every round of the protocol but masked input collection); the mod
  calls the device's code (and expands mask seeds) only in the collect-masked-vectors
  stage, which takes the ``train`` path above.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import (RECORD_KEY_CONFIGS, Key,
                                                                 Stage)


def _handle(handler: str, message: Message, context: Context) -> Message:
    """The device's ``handler`` of :mod:`privaterec.fed.flower.client_app` with the run
    layer's device loader (both imported on first use)."""
    from privaterec.fed.flower import client_app as handlers
    from privaterec.runs.engines import load_device
    reply: Message = getattr(handlers, handler)(load_device, message, context)
    return reply


def _keys_only_stage(message: Message) -> bool:
    """Whether ``message`` is a SecAgg+ stage that never reaches the device's code."""
    configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
    return configs is not None and configs.get(Key.STAGE) in (Stage.SETUP, Stage.SHARE_KEYS,
                                                              Stage.UNMASK)


def _not_called(message: Message, context: Context) -> Message:
    raise AssertionError("secaggplus_mod called the device in a stage without a vector")


client_app = ClientApp()


@client_app.query()
def query(message: Message, context: Context) -> Message:
    return _handle("client_query", message, context)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    if _keys_only_stage(message):
        return secaggplus_mod(message, context, _not_called)
    return _handle("handle_train", message, context)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    return _handle("client_evaluate", message, context)


__all__ = ["client_app"]
