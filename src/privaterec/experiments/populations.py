"""Population sizes of an experiment: one synthetic data set and one run cache per size.

A population of N users uses the embedded default synthetic data set
(:func:`~privaterec.experiments.settings.demo_synth_config`) with only ``users`` changed, so
the click model and the news count are the same at every size. The default size keeps the
data directory and run cache of the other experiments (``OUT/data/synth-default`` and
``OUT/runs``, so their runs are reused); another size N uses ``OUT/data/synth-N`` and
``OUT/users-N/runs`` (``synth-quick*`` and ``runs-quick`` with ``quick``). A ``--data``
directory is one population of its own.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.errors import ConfigError
from privaterec.validators import fail
from privaterec.experiments.common import log, resolve_data
from privaterec.experiments.settings import demo_synth_config


@dataclass(frozen=True)
class Population:
    """One population size: its data set and run cache root.

    ``users``: the synthetic data's ``users`` (``None``: a ``--data`` directory).
    """

    users: int | None
    data: str
    root: Path
    ldp: bool
    synth: SynthConfig | None = None

    @property
    def label(self) -> str:
        return f"{self.users:,}" if self.users is not None else Path(self.data).name


def population_config(users: int, *, quick: bool) -> SynthConfig:
    """The synthetic data set of a population: the embedded default (``quick``: the small
    one) with ``users`` changed, so the click model and the news count are the same."""
    return dataclasses.replace(demo_synth_config(quick), users=users)


def population_paths(out: Path, users: int, *, quick: bool) -> tuple[Path, Path]:
    """``(data directory, run cache root)`` of a population.

    The default size uses ``OUT/data/synth-default`` (``synth-quick``) and ``OUT`` — the data
    and runs of ``experiment table1``; another size ``OUT/data/synth[-quick]-<users>`` and
    ``OUT/users-<users>``.
    """
    out = Path(out)
    prefix = "synth-quick" if quick else "synth"
    if population_config(users, quick=quick) == demo_synth_config(quick):
        return (out / "data" / ("synth-quick" if quick else "synth-default")).resolve(), out
    return (out / "data" / f"{prefix}-{users}").resolve(), out / f"users-{users}"


def synthesize(path: Path, config: SynthConfig, *, progress: bool) -> None:
    """Write ``config``'s data set to ``path`` unless it is there (written to a sibling
    directory first and renamed, so an interrupted synthesis is never taken for data)."""
    if (path / "test" / "behaviors.tsv").exists():
        return
    log(f"synthesising {config.users:,} users, {config.news:,} news into {path} ...",
        progress=progress)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_synthetic(partial, config)
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)


def check_users(users: Sequence[int], name: str = "users") -> tuple[int, ...]:
    """Validated population sizes: distinct integers >= 2, in increasing order.

    Raises
    ------
    ConfigError
        Naming the parameter.
    """
    values = tuple(users)
    if not values or any(isinstance(u, bool) or not isinstance(u, int) or u < 2
                         for u in values) or len(set(values)) != len(values):
        fail(name, list(values), "one or more distinct integers >= 2 (synthetic users)", kind="")
    return tuple(sorted(values))


def make_populations(out: Path, data: str | None, users: Sequence[int] | None,
                     ldp_users: Sequence[int] | None, *, default_users: Sequence[int],
                     quick: bool) -> list[Population]:
    """The populations of ``users`` (default ``default_users``; ``quick``: the small data
    set's size), ``ldp`` for the sizes in ``ldp_users`` (default: the smallest; an empty
    sequence: none), or the one population of ``data``.

    Raises
    ------
    ConfigError
        If ``data`` comes with ``users`` or ``ldp_users``, a size is invalid, or a size of
        ``ldp_users`` is not in ``users``.
    """
    if data is not None:
        if users is not None or ldp_users is not None:
            raise ConfigError("--users and --ldp-users make synthetic populations; with "
                              "--data the population is that data set: drop them")
        path = resolve_data(out, data, quick=quick, progress=False)
        return [Population(None, path, out, ldp=True)]
    sizes = check_users(users if users is not None else
                        ((demo_synth_config(True).users,) if quick else default_users))
    if ldp_users is None:
        ldp: tuple[int, ...] = sizes[:1]
    else:
        ldp = check_users(ldp_users, "ldp_users") if ldp_users else ()
    extra = sorted(set(ldp) - set(sizes))
    if extra:
        raise ConfigError(f"invalid 'ldp_users': {extra} not among --users {list(sizes)}; "
                          f"the local-DP rows run at some of the population sizes")
    populations = []
    for size in sizes:
        data_dir, root = population_paths(out, size, quick=quick)
        populations.append(Population(size, str(data_dir), root, ldp=size in ldp,
                                      synth=population_config(size, quick=quick)))
    return populations


__all__ = ["Population", "check_users", "make_populations", "population_config",
           "population_paths", "synthesize"]
