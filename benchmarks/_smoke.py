"""What every benchmark's ``--smoke`` setting shares: tiny data and a throwaway output folder.

``--smoke`` runs a benchmark end to end at the smallest sizes that still exercise its code,
so the test suite (``tests/benchmarks/test_smoke.py``) notices when a benchmark rots. Its
numbers mean nothing and go to a temporary directory, never to ``benchmarks/results``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def smoke_dir(name: str) -> Path:
    """A fresh temporary directory for one smoke run's outputs."""
    return Path(tempfile.mkdtemp(prefix=f"privaterec-{name}-smoke-"))


def smoke_data(users: int = 120, news: int = 400, seed: int = 0) -> Path:
    """A tiny synthetic MIND-format data set (``train/``, ``test/``) in a temporary directory."""
    from privaterec.data.synth import SynthConfig, write_synthetic

    out = smoke_dir("data") / "synth"
    write_synthetic(out, SynthConfig(users=users, news=news, seed=seed))
    return out


def smoke_model(**overrides):  # -> privaterec.config.ModelConfig
    """A tiny NRMS (16-d words, 2 heads of 8, titles of 8, histories of 10): seconds per run."""
    from dataclasses import replace

    from privaterec.config import ModelConfig

    return replace(ModelConfig(word_dim=16, num_heads=2, head_dim=8, attention_dim=16,
                               title_len=8, abstract_len=4, history_len=10), **overrides)


class InProcessGrid:
    """A Flower Grid of ``nodes`` SuperNodes that runs ``client_app`` in this process: each
    message goes through Flower's wire format (serialized and parsed, as SecAgg+'s mod
    expects) to the ClientApp of its node (``partition-id`` ``p`` of ``nodes``, as in
    Flower's simulation runtime), and its reply comes back the same way.

    A smoke run on it exercises the same ServerApp rounds, ClientApp handlers and SecAgg+
    stages as on Flower's Ray simulation runtime, without Ray's start-up (about a minute).
    """

    def __init__(self, client_app, nodes: int) -> None:  # client_app: flwr ClientApp
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        # Flower stamps messages with the running task's identity (set by its runtimes)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.client_app = client_app
        self.contexts = {1000 + p: Context(run_id=1, node_id=1000 + p, state=RecordDict(),
                                           node_config={"partition-id": p,
                                                        "num-partitions": nodes},
                                           run_config={})
                         for p in range(nodes)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list:
        from flwr.app import Error, Message
        from flwr.common.serde import message_from_proto, message_to_proto

        def wire(message: Message) -> Message:
            return message_from_proto(message_to_proto(message))

        replies = []
        for message in messages:
            received = wire(message)
            try:
                reply = self.client_app(received, self.contexts[message.metadata.dst_node_id])
            except Exception as error:  # noqa: BLE001 - the node's failure, as Flower sends it
                reply = Message(Error(code=0, reason=repr(error)), reply_to=received)
            replies.append(wire(reply))
        return replies
