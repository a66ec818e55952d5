"""The federated methods: small classes with the same hooks, and their registry.

* :mod:`.base` — :class:`ClientMethod`, the hooks every method has (``inputs``,
  ``privatize``, ``events``, ``describe``) and the computation the engine calls (``update``
  for one client, ``round`` for a round's clients at once);
* :mod:`.ranking` — FedRec, FedNewsRec, DP-FedRec; :mod:`.privaterec` — PrivateRec paper and
  strict mode; :mod:`.dp_fedavg` — central DP (DP-FedAvg) as a wrapper around any method;
  :mod:`.unifedrec` — Uni-FedRec's LDP upload (the recall task's method);
* :mod:`.registry` — the methods by name (every class of these modules that declares its
  ``settings_type``), :func:`resolve_run_config` and :func:`method_from_config`. Each class
  owns its settings (``settings_type``, from :mod:`privaterec.method_settings`) and its
  defaults of the engine's settings (``server_defaults``).
"""

from __future__ import annotations

from privaterec.fed.methods.base import ClientMethod, RoundContext, RoundOutput
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.methods.privaterec import (PAPER_MODE_NOTE, PRIVATEREC_BASIS, PrivateRec,
                                               PrivateRecStrict, privaterec_train_events,
                                               uncovered_groups)
from privaterec.fed.methods.ranking import DPFedRec, FedNewsRec, FedRec, RankingMethod
from privaterec.fed.methods.registry import (CLASSES, METHODS, RunMethod, method_from_config,
                                             resolve_run_config)
from privaterec.fed.methods.unifedrec import UniFedRecLDP

__all__ = ["CLASSES", "CentralDP", "ClientMethod", "DPFedRec", "FedNewsRec", "FedRec", "METHODS",
           "PAPER_MODE_NOTE", "PRIVATEREC_BASIS", "PrivateRec", "PrivateRecStrict",
           "RankingMethod", "RoundContext", "RoundOutput", "RunMethod", "method_from_config",
           "privaterec_train_events", "resolve_run_config", "uncovered_groups", "UniFedRecLDP"]
