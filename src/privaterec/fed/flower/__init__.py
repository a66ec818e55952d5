"""The Flower engine (docs/flower.md): federated training over Flower's Message API.

This package is the only one that imports ``flwr``, and it is only a transport: it runs the
same rounds as the in-process simulator for any task and method
(:class:`~privaterec.fed.task.FederatedTask`,
:class:`~privaterec.fed.methods.base.ClientMethod`), but each client update is computed by a
Flower ``ClientApp`` on the SuperNode that holds the client's data. Its modules:

* :mod:`~privaterec.fed.flower.messages` — what server and devices exchange: typed record
  accessors, the run's public files, the round's randomness entry, the public fingerprint;
* :mod:`~privaterec.fed.flower.client_app` — the device side (the ClientApp);
* :mod:`~privaterec.fed.flower.server_app` — the server side (discovery, round functions,
  :func:`~privaterec.fed.flower.server_app.serve`);
* :mod:`~privaterec.fed.flower.secure` — SecAgg+ glue: the mask generator
  (:func:`~privaterec.fed.flower.secure.install_mask_prg`, called explicitly by the ClientApp
  and by the server's secure summation) and one secure-summation session;
* :mod:`~privaterec.fed.flower.engine` — :class:`FlowerEngine` (a Grid or Flower's
  simulation runtime).

Before the first round the server sends every node a ``query`` message with the run's
public files and asks which users it holds; a device can pin its own files with the node
option ``run-dir`` instead. The server sends a fingerprint of the public task and of the
client method with θ; a device whose rebuilt task or method differs refuses the round.
"""

from __future__ import annotations

import os

# Flower and Ray phone home by default (telemetry, update check, usage statistics); a
# training run must not send traffic anywhere but to its own nodes. Set these variables
# to another value before importing privaterec.fed.flower to opt in.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a FutureWarning

from privaterec.fed.flower.client_app import (ClientSpec, Device, DeviceLoader,  # noqa: E402
                                              make_client_app)
from privaterec.fed.flower.engine import FlowerEngine  # noqa: E402
from privaterec.fed.flower.messages import public_fingerprint, run_record  # noqa: E402
from privaterec.fed.flower.secure import (MASK_PRG, install_mask_prg, mask_prg,  # noqa: E402
                                          secure_sum)
from privaterec.fed.flower.server_app import discover_nodes, serve  # noqa: E402

__all__ = ["ClientSpec", "Device", "DeviceLoader", "FlowerEngine", "MASK_PRG",
           "discover_nodes", "install_mask_prg", "make_client_app", "mask_prg",
           "public_fingerprint", "run_record", "secure_sum", "serve"]
