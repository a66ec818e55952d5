"""``--device`` and the device-agnostic paths, exercised on the CPU (docs/gpu.md).

The CUDA side (one round of each method on the GPU against the CPU) is tests/test_cuda.py,
skipped where PyTorch sees no GPU.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.serialization

from privaterec.cli import main
from privaterec.errors import ConfigError
from privaterec.runtime.checkpoint import load_checkpoint
from privaterec.runtime.device import (current_device, resolve_device, run_device,
                                       using_device)

TINY_MODEL = """\
model:
  word_dim: 16
  num_heads: 2
  head_dim: 8
  attention_dim: 16
  history_len: 10
  title_len: 8
  abstract_len: 4
"""

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--out", str(out), "--users", "60", "--news", "200",
                 "--seed", "4"]) == 0
    return out


def test_resolve_device_accepts_the_documented_names():
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(None) == auto
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", "mps"):
        with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:N"):
            resolve_device(bad)


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="pass --device cpu"):
        resolve_device("cuda")


def test_a_cuda_index_beyond_the_visible_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"only 2 CUDA device\(s\).*cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_using_device_sets_the_default_of_the_run_functions():
    assert current_device() == torch.device("cpu")
    with using_device("cpu") as device:
        assert device == torch.device("cpu") and run_device(None) == device
    assert run_device("cpu") == torch.device("cpu")


def test_moving_the_model_moves_its_news_table(tiny_split):
    # The table is not a buffer: the Recommender's own _apply moves it with the parameters
    # (here to the meta device, which every machine has).
    from privaterec.config import ModelConfig
    from privaterec.data.features import build_news_features, build_vocabularies
    from privaterec.models.factory import build_recommender

    config = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                         abstract_len=4, history_len=5)
    vocabs = build_vocabularies(tiny_split.news.values())
    features = build_news_features(tiny_split.news, vocabs, title_len=6, abstract_len=4)
    model = build_recommender(config, vocabs, features)
    assert model.features is not None and model.features.title.device.type == "cpu"
    model.to("meta")
    assert model.features.title.device.type == "meta"
    assert model.features.news_ids == features.news_ids  # the ids and rows stay
    assert features.title.device.type == "cpu"  # the caller's table is not changed


@no_cuda
@pytest.mark.parametrize("command", ["train", "evaluate", "experiment", "demo"])
def test_cuda_on_a_machine_without_it_exits_2_naming_the_flag(command, tmp_path, capsys):
    argv = {"train": ["train", "--data", str(tmp_path), "--out", str(tmp_path / "run")],
            "evaluate": ["evaluate", "--run", str(tmp_path / "run")],
            "experiment": ["experiment", "table1", "--out", str(tmp_path / "x")],
            "demo": ["demo", "--out", str(tmp_path / "d")]}[command]
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "pass --device cpu" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "x").exists()


def test_an_unknown_device_exits_2(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"),
                 "--device", "tpu"]) == 2
    assert "invalid --device 'tpu'" in capsys.readouterr().err


def _as_if_saved_on_cuda(path):
    """Rewrite the checkpoint at ``path`` with every tensor's storage tagged ``cuda:0``, as
    ``torch.save`` writes tensors that live on a GPU."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, path)
    finally:
        torch.serialization.location_tag = original


@no_cuda
def test_a_checkpoint_written_on_a_gpu_loads_and_evaluates_on_the_cpu(synth_dir, tmp_path,
                                                                      capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "run"
    assert main(["train", "--data", str(synth_dir), "--method", "fedrec", "--config",
                 str(config), "--rounds", "2", "--clients-per-round", "8", "--out", str(run),
                 "--no-progress", "--json", "--device", "cpu"]) == 0
    trained = json.loads(capsys.readouterr().out)["test"]
    _as_if_saved_on_cuda(run / "checkpoint.pt")
    with pytest.raises(RuntimeError, match="CUDA"):  # what a load without map_location does
        torch.load(run / "checkpoint.pt", weights_only=False)
    state = load_checkpoint(run / "checkpoint.pt")  # the Flower engine's and the SDK's load
    assert all(t.device.type == "cpu" for t in state["model"].values())
    assert main(["evaluate", "--run", str(run), "--json", "--no-progress",
                 "--device", "cpu"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["auc"] == pytest.approx(trained["auc"], abs=1e-9)
    from privaterec.runs.ranking_setup import load_run_model

    _, _, model = load_run_model(run)  # how the device SDK's bundle rebuilds the model
    assert next(model.parameters()).device.type == "cpu"


def test_the_published_nrms_preset_has_the_published_size(tmp_path):
    from privaterec.cli import build_parser, run_config_from_args
    from privaterec.config import ModelConfig, model_preset
    from privaterec.data.text import TextVocabularies
    from privaterec.models.factory import build_recommender

    parser = build_parser()
    base = ["train", "--data", str(tmp_path), "--out", str(tmp_path / "run")]
    model = run_config_from_args(parser.parse_args([*base, "--preset", "nrms-published"])).model
    assert (model.news_encoder, model.embeddings, model.word_dim, model.num_heads,
            model.head_dim, model.attention_dim, model.title_len) == (
        "nrms", "corpus", 300, 20, 20, 200, 30)
    override = run_config_from_args(parser.parse_args(
        [*base, "--preset", "nrms-published", "--word-dim", "100", "--history-len", "20"]))
    assert override.model.word_dim == 100 and override.model.num_heads == 20
    assert override.model.history_len == 20
    vocabs = TextVocabularies(kind="word", words=["<pad>", "<unk>", "a"],
                              categories=["<pad>", "<unk>"], subcategories=["<pad>", "<unk>"],
                              news_ids=["<pad>", "<unk>", "N1"])

    def trained(config: ModelConfig) -> int:
        model = build_recommender(config, vocabs, for_checkpoint=True)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    assert trained(ModelConfig()) == 91_200
    assert trained(model_preset("nrms-published")) == 1_003_500
    with pytest.raises(ConfigError, match="nrms-published"):
        model_preset("nrms-huge")
