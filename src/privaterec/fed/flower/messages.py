"""What server and devices exchange: typed accessors of Flower records, the run's public
files, the round's randomness entry and the public fingerprint both sides compare.

Flower types a RecordDict's records as ``ArrayRecord | MetricRecord | ConfigRecord`` and a
record's values as a union of scalars and lists. What arrives is what this package sent;
the accessors check it and name the field when it is not.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from privaterec.errors import PrivateRecError
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.task import FederatedTask

RUN_RECORD = "privaterec-run"
"""Key of the node state (``Context.state``) holding the run's public configuration."""

_Record = TypeVar("_Record", ArrayRecord, MetricRecord, ConfigRecord)
_Item = TypeVar("_Item", int, float, str)


def field_record(content: RecordDict, key: str, kind: type[_Record]) -> _Record:
    """The record ``content[key]``, checked to be a ``kind``."""
    record = content[key]
    if not isinstance(record, kind):
        raise PrivateRecError(f"Flower message: record {key!r} is a {type(record).__name__}, "
                              f"expected a {kind.__name__}")
    return record


def field_value(record: Mapping[str, object], key: str, kind: type[_Item]) -> _Item:
    """The scalar ``record[key]``, checked to be a ``kind``."""
    value = record[key]
    if not isinstance(value, kind):
        raise PrivateRecError(f"Flower message: {key!r} is {value!r}, expected a "
                              f"{kind.__name__}")
    return value


def field_values(record: Mapping[str, object], key: str, kind: type[_Item]) -> list[_Item]:
    """The list ``record[key]``, checked to hold ``kind`` items only."""
    value = record[key]
    if not isinstance(value, list):
        raise PrivateRecError(f"Flower message: {key!r} is a {type(value).__name__}, "
                              f"expected a list of {kind.__name__}")
    items: list[_Item] = []
    for item in value:
        if not isinstance(item, kind):
            raise PrivateRecError(f"Flower message: {key!r} holds {item!r}, expected a list "
                                  f"of {kind.__name__}")
        items.append(item)
    return items


def public_fingerprint(task: FederatedTask[Any], method: ClientMethod) -> str:
    """SHA-256 of θ's layout, the task's public tensors and the client method.

    Server and devices compare it before a round: they must run the same public task
    (frozen word vectors, fixed news vectors, ... are not part of θ) and the same
    clipping/noise.
    """
    digest = hashlib.sha256()
    digest.update(repr((task.spec.names, task.spec.shapes, method)).encode())
    for name, tensor in sorted(task.public_state().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def reply_error(reply: Message) -> str:
    """The reason a SuperNode's reply failed, naming the node."""
    return f"SuperNode {reply.metadata.src_node_id}: {reply.error.reason}"


def run_record(files: Mapping[str, str]) -> ConfigRecord:
    """The run's public files sent to every SuperNode (name → text, e.g. ``config.yaml``
    and ``vocab.json``; a missing ``vocab.json``: devices rebuild the vocabularies from
    their data)."""
    return ConfigRecord({"names": list(files), "texts": list(files.values())})


def seed_entry(seed: int, deployed: bool) -> dict[str, int | bool]:
    """What a round's configuration says of the randomness: a simulation sends its seed
    (every node's draws are seeded by (seed, round, user), as on the simulator); a deployed
    server sends none, only that it is deployed
    (:func:`privaterec.fed.flower.client_app.secure_source`)."""
    return {"deployed": True} if deployed else {"seed": seed}


__all__ = ["RUN_RECORD", "field_record", "field_value", "field_values", "public_fingerprint",
           "reply_error", "run_record", "seed_entry"]
