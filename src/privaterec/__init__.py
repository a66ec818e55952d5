"""privaterec: privacy-preserving federated news recommendation.

Implements PrivateRec (Liu et al., 2022), Uni-FedRec (Qi et al., 2021) and FedNewsRec
(Qi et al., 2020) on one engine, with their baselines. See README.md and docs/.
"""

__version__ = "0.1.0"
