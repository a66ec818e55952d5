"""Run orchestration: train and evaluate a run directory, ranking and recall alike.

The layer above the engines (:mod:`privaterec.fed`, :mod:`privaterec.training`,
:mod:`privaterec.recall`) and below the command line and the apps:

* :mod:`.directory` — run directories (``config.yaml``, ``checkpoint.pt``, ``metrics.json``,
  ``privacy.json``);
* :mod:`.ranking` — ``train_run`` / ``evaluate_run`` of a ranking method;
* :mod:`.recall` — Uni-FedRec runs (``privaterec train --method unifedrec --ranker RUN``);
* :mod:`.report` — the ``release`` block of ``privacy.json`` built from a method's
  description;
* :mod:`.engines` — which engine trains a run (the simulator or Flower) and how a Flower
  device rebuilds a run's public task.
"""
