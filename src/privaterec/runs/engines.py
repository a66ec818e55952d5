"""Which engine trains a run, and how a Flower device rebuilds the run's public task.

:func:`build_engine` returns the simulator or a :class:`~privaterec.fed.flower.FlowerEngine`
(on a given Grid, or in Flower's simulation runtime). :func:`load_device` is the Flower
ClientApp's :data:`~privaterec.fed.flower.DeviceLoader`: from the run's public files (a
ranking run's ``config.yaml`` and ``vocab.json``, a Uni-FedRec run's ``recall.yaml``) and the
device's data it rebuilds the public task exactly as the server's run layer builds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from privaterec.errors import ConfigError
from privaterec.fed.engine import Engine, SimulatorEngine
from privaterec.runs.directory import RunDirectory

if TYPE_CHECKING:
    from privaterec.fed.flower.client_app import ClientSpec, Device


def build_engine(name: str, *, run_files: Mapping[str, str] | None = None,
                 grid: Any = None, deployed: bool = True) -> Engine:
    """The engine ``name`` (``fed.engine``): ``simulator``, or ``flower`` on ``grid`` (a
    ``flwr run`` ServerApp's Grid) or in Flower's simulation runtime. ``run_files``: the
    run's public files the devices rebuild the task from. ``deployed`` (with ``grid``):
    ``False`` for a seeded rehearsal of a deployment (:func:`privaterec.fed.flower.serve`)."""
    if name == "simulator" and grid is None:
        return SimulatorEngine()
    from privaterec.fed.flower.engine import FlowerEngine

    return FlowerEngine(load_device, run_files or {}, grid=grid, deployed=deployed)


def load_device(spec: "ClientSpec") -> "Device":
    """Rebuild a run's public task, its client method and this device's clients.

    Raises
    ------
    ConfigError
        If ``spec.run_dir`` holds no run configuration.
    """
    run = RunDirectory(Path(spec.run_dir))
    if run.is_recall:
        return _recall_device(run, spec.data_dir)
    if not run.config_path.exists():
        raise ConfigError(f"{run.config_path}: not found; the SuperNode's run-dir must hold "
                          f"the run's config.yaml (and vocab.json), or recall.yaml")
    return _ranking_device(run, spec.data_dir)


def _ranking_device(run: RunDirectory, data_dir: str) -> "Device":
    from privaterec.config import RunConfig, replace
    from privaterec.data.text import TextVocabularies
    from privaterec.fed.evaluation import TestImpressions, evaluation_policy
    from privaterec.fed.flower.client_app import Device
    from privaterec.fed.methods import method_from_config, resolve_run_config
    from privaterec.fed.objective import LocalObjective
    from privaterec.runs.artifacts import WORD_VECTORS_FILE, decode_word_vectors
    from privaterec.runs.ranking_setup import build_run_model, prepare_data

    config = resolve_run_config(RunConfig.from_yaml(run.config_path))
    if data_dir:
        config = replace(config, data=data_dir)
    vocabs = TextVocabularies.load(run.vocab_path) if run.vocab_path.exists() else None
    # A run that trained must have loaded its data; dropping dangling references is then a
    # no-op or what the run did (load_dataset raises on them otherwise).
    prepared = prepare_data(config, drop_missing=True, vocabs=vocabs)
    # The public model exactly as privaterec.runs.ranking.train_run initialises it, with the
    # "corpus" word vectors the server shipped (hash-checked) instead of fitting them again.
    shipped = run.path / WORD_VECTORS_FILE
    vectors = decode_word_vectors(shipped.read_text()) if shipped.exists() else None
    task = LocalObjective(build_run_model(config, prepared, word_vectors=vectors))
    # Federated evaluation: the device's own policy (from its copy of the configuration)
    # and its own test impressions, if its data directory has a test/ split.
    policy = evaluation_policy(config.fed)
    test = prepared.dataset.test
    return Device.of(task, method_from_config(config), prepared.train_clients,
                     evaluation=policy,
                     test=None if policy is None or test is None else TestImpressions(
                         test, prepared.features, history_len=config.model.history_len,
                         batch_size=config.train.eval_batch_size))


def _recall_device(run: RunDirectory, data_dir: str) -> "Device":
    from privaterec.data.mind import load_dataset
    from privaterec.fed.flower.client_app import Device
    from privaterec.recall.task import RecallTask
    from privaterec.runs.recall_setup import RecallRunConfig, recall_setup

    config = RecallRunConfig.from_yaml(run.recall_config_path).resolved()
    dataset = load_dataset(data_dir or config.data, drop_missing=True)
    # The recall model, news vectors and pool exactly as train_recall_run builds them.
    setup = recall_setup(config, dataset)
    task = RecallTask(setup.model, setup.vectors, pool_rows=setup.pool_rows,
                      options=config.train)
    return Device.of(task, config.method(), setup.clients)


__all__ = ["build_engine", "load_device"]
