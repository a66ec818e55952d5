"""privaterec: privacy-preserving federated news recommendation.

Implements PrivateRec (Liu et al., 2022), Uni-FedRec (Qi et al., 2021) and FedNewsRec
(Qi et al., 2020) on one engine, with their baselines, central user-level DP (DP-FedAvg),
private serving and local ranking.

The top-level API (:mod:`privaterec.api`):

- :func:`train` — train on MIND-format data into a run directory, privacy as one argument
  (``method="dp-fedavg", target_epsilon=1.0``);
- :func:`evaluate` — test metrics, optionally through private serving or local ranking;
- :func:`privacy_report` — every release composed per user;
- :func:`service` / :func:`serve` — the serving API in this process, or over HTTP;
- :func:`synthesize` — a synthetic MIND-format data set; :func:`run_config` — the
  configuration :func:`train` would run.

Importing the package loads no model code (no torch): every function imports what it needs.
See README.md and docs/.
"""

from privaterec.api import (PrivacyReport, Run, evaluate, privacy_report, run_config, serve,
                            service, synthesize, train)
from privaterec.version import __version__

__all__ = ["PrivacyReport", "Run", "__version__", "evaluate", "privacy_report", "run_config",
           "serve", "service", "synthesize", "train"]
