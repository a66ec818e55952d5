"""The ``release`` block of ``privacy.json``: a method's description plus what every method
shares (its user-level ε per round and what its clients send).

Methods describe themselves (:meth:`~privaterec.fed.methods.base.ClientMethod.describe`,
their events); this module, outside the engine, turns that into the report's block.
"""

from __future__ import annotations

from typing import Any, Sequence

from privaterec.fed.methods.base import ClientMethod


def release_description(method: ClientMethod, *, dimension: int,
                        noised_parameters: Sequence[str], clients_per_round: int,
                        client_fraction: float, population: int | None = None
                        ) -> dict[str, Any]:
    """Description of one client's per-round release, for ``privacy.json``.

    Parameters
    ----------
    method: the run's client method. dimension: D.
    noised_parameters: the names of θ's parameters.
    clients_per_round, client_fraction: the round's public sampling (m and m / users).
    population: N, the users the rounds sample from (written as ``population``; the report's
        δ < 1/N check uses it rather than the users the ledger has seen so far).
    """
    out = method.describe(dimension=dimension, parameters=noised_parameters,
                          clients_per_round=clients_per_round, client_fraction=client_fraction)
    out["epsilon_per_round_user"], out["delta_per_round_user"] = method.round_epsilon(
        dimension, "user")
    if population is not None:
        out["population"] = int(population)
    if "sends" not in out:  # a method whose client sends more says so itself
        out["sends"] = ("released update, sample count, loss" if method.sends_metadata
                        else "released update only")
    return out


__all__ = ["release_description"]
