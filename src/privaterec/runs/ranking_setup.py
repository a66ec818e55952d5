"""What a ranking run is built from: its data, vocabularies, training clients and model.

The run layer (:mod:`privaterec.runs.ranking`) trains and evaluates with them, and a Flower
device (:func:`privaterec.runs.engines.load_device`) rebuilds exactly the same public task
from the run's public files; both import them from here, below the engine choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from privaterec.config import RunConfig
from privaterec.data.clients import ClientDataset, build_client_dataset, roster_clients
from privaterec.data.features import NewsFeatures, build_news_features, build_vocabularies
from privaterec.data.mind import (NEWS_FILE, load_dataset, read_news, read_split,
                                  split_directories)
from privaterec.data.records import MindDataset, MindSplit
from privaterec.data.roster import ROSTER_FILE, read_roster
from privaterec.data.text import TextVocabularies
from privaterec.errors import CheckpointError
from privaterec.models.factory import build_recommender, vocabulary_kind
from privaterec.models.recommender import Recommender
from privaterec.runs.directory import RunDirectory
from privaterec.runtime.checkpoint import load_checkpoint


@dataclass
class PreparedData:
    """A loaded dataset with its vocabularies, news table and training clients."""

    dataset: MindDataset
    vocabs: TextVocabularies
    features: NewsFeatures
    train_clients: ClientDataset


def prepare_data(config: RunConfig, *, drop_missing: bool = False,
                 vocabs: TextVocabularies | None = None) -> PreparedData:
    """Load ``config.data`` and build everything a trainer needs.

    Vocabularies come from the training split's news only
    (docs/privacy.md#data-used-for-tuning-and-vocabularies) unless ``vocabs`` (e.g. those of a
    trained run) are given.
    """
    dataset = load_dataset(config.data, drop_missing=drop_missing)
    model = config.model
    if vocabs is None:
        vocabs = build_vocabularies(dataset.train.news.values(), kind=vocabulary_kind(model),
                                    min_count=model.min_word_count)
    features = build_news_features(dataset.all_news(), vocabs, title_len=model.title_len,
                                   abstract_len=model.abstract_len)
    clients = build_client_dataset(dataset.train, features, history_len=model.history_len)
    return PreparedData(dataset, vocabs, features, clients)


def prepare_public_data(config: RunConfig, *, eval_data: str | Path | None = None,
                        drop_missing: bool = False) -> PreparedData:
    """What a deployed server holding no user data builds its run from: ``config.data`` is a
    public directory (:mod:`privaterec.data.roster`), whose ``news.tsv`` (the public
    catalogue) gives the vocabularies and news table and whose ``roster.txt`` the users
    (:func:`~privaterec.data.clients.roster_clients`: no sample, no history). No behaviors
    file is opened, except the explicit public or consented holdout ``eval_data`` (its
    ``test/`` split, or its single split), which becomes the data set's test split: the
    server evaluates on it and on nothing else (docs/privacy.md#threat-model).

    Raises
    ------
    DataFormatError
        If the catalogue, the roster or the holdout is missing or malformed.
    """
    public = Path(config.data)
    catalogue = read_news(public / NEWS_FILE)
    holdout = None
    if eval_data is not None:
        dirs = split_directories(eval_data)
        holdout = read_split(dirs["test"] or dirs["train"], drop_missing=drop_missing)
    dataset = MindDataset(train=MindSplit(news=catalogue, behaviors=[], path=public),
                          test=holdout, path=public)
    model = config.model
    vocabs = build_vocabularies(catalogue.values(), kind=vocabulary_kind(model),
                                min_count=model.min_word_count)
    features = build_news_features(dataset.all_news(), vocabs, title_len=model.title_len,
                                   abstract_len=model.abstract_len)
    clients = roster_clients(read_roster(public / ROSTER_FILE), history_len=model.history_len)
    return PreparedData(dataset, vocabs, features, clients)


def build_run_model(config: RunConfig, prepared: PreparedData, *,
                    word_vectors: torch.Tensor | None = None) -> Recommender:
    """The run's initial model: seeded with ``train.seed``, news table attached.

    Every engine builds it this way, so frozen parameters that are not trained (e.g. random
    frozen word vectors) are the same on the server and on every device.
    """
    torch.manual_seed(config.train.seed)
    return build_recommender(config.model, prepared.vocabs, prepared.features,
                             word_vectors=word_vectors)


def load_run_model(run_dir: str | Path) -> tuple[RunConfig, TextVocabularies, Recommender]:
    """Rebuild a trained model from its run directory (no news table attached)."""
    run = RunDirectory(Path(run_dir))
    config = run.config()
    if config.train.method == "popularity":
        raise CheckpointError(f"{run.path}: a popularity run has no neural model")
    vocabs = TextVocabularies.load(run.vocab_path)
    model = build_recommender(config.model, vocabs, for_checkpoint=True)
    state = load_checkpoint(run.checkpoint_path)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{run.checkpoint_path}: does not match the model in "
                              f"{run.config_path} ({exc})"
                              f"{_mismatch_cause(run, model, state['model'])}") from None
    model.eval()
    return config, vocabs, model


def _mismatch_cause(run: RunDirectory, model: Recommender,
                    saved: dict[str, torch.Tensor]) -> str:
    """Why a checkpoint does not load into the model its run directory describes: parameters
    of other shapes come from ``vocab.json`` not being the one the model was trained with; a
    basis without the centred attention's reference was trained with the dot-product
    attention of earlier versions. Empty when neither is the case."""
    expected = model.state_dict()
    resized = [f"{key} {tuple(value.shape)} in the checkpoint, {tuple(expected[key].shape)} "
               f"from {run.vocab_path.name}" for key, value in saved.items()
               if key in expected and tuple(value.shape) != tuple(expected[key].shape)]
    if resized:
        return (f"; the vocabularies in {run.vocab_path} are not those the model was trained "
                f"with ({'; '.join(resized)}): the file was replaced after training (earlier "
                f"versions rewrote it when a run's train command was run again on changed "
                f"data). Restore the run's own vocab.json, or train the run again")
    has_basis = any(k.startswith("basis.") for k in saved)
    if (has_basis and any(k.startswith("basis.reference.") for k in expected)
            and not any(k.startswith("basis.reference.") for k in saved)):
        return ("; the run was trained with the published dot-product basis attention "
                "(before 'model.basis_attention' existed): add 'basis_attention: dot' under "
                "'model:' in its config.yaml")
    return ""


__all__ = ["PreparedData", "build_run_model", "load_run_model", "prepare_data",
           "prepare_public_data"]
