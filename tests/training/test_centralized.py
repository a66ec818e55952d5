import pytest
import torch

from privaterec.config import ModelConfig, TrainConfig
from privaterec.data.clients import build_client_dataset
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.models.factory import build_recommender
from privaterec.training.centralized import parameter_groups, train_centralized

SMALL = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                    abstract_len=4, history_len=3, dropout=0.2)


def _setup(split, seed=0):
    vocabs = build_vocabularies(split.news.values())
    features = build_news_features(split.news, vocabs, title_len=6, abstract_len=4)
    clients = build_client_dataset(split, features, history_len=3)
    torch.manual_seed(seed)
    return build_recommender(SMALL, vocabs, features), clients


def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_lowers_the_loss(tiny_split):
    model, clients = _setup(tiny_split)
    log = train_centralized(model, clients, TrainConfig(epochs=40, batch_size=2, lr=0.03),
                            progress=False)
    assert log[-1]["loss"] < 0.7 * log[0]["loss"]


def test_same_seed_same_parameters(tiny_split):
    a, clients = _setup(tiny_split)
    b, _ = _setup(tiny_split)
    config = TrainConfig(epochs=2, batch_size=2)
    train_centralized(a, clients, config, progress=False)
    train_centralized(b, clients, config, progress=False)
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_killed_and_resumed_run_equals_uninterrupted_run(tiny_split, tmp_path):
    config = TrainConfig(epochs=3, batch_size=2, lr=0.01)
    reference, clients = _setup(tiny_split)
    train_centralized(reference, clients, config, progress=False)

    ckpt = tmp_path / "checkpoint.pt"
    for stop in (1, 3, 2):  # stops mid-epoch and at an epoch boundary (3 steps per epoch)
        model, _ = _setup(tiny_split)
        train_centralized(model, clients, config, checkpoint_path=ckpt, progress=False,
                          stop_after_steps=stop)
    resumed, _ = _setup(tiny_split, seed=123)  # different init: everything must come from ckpt
    log = train_centralized(resumed, clients, config, checkpoint_path=ckpt, progress=False)
    assert [e["epoch"] for e in log] == [1, 2, 3]
    pr, pu = _params(reference), _params(resumed)
    assert all(torch.equal(pr[k], pu[k]) for k in pr)


@pytest.mark.parametrize("layers", [0, 1])
def test_plm_fine_tuned_layers_take_plm_lr(tiny_split, layers):
    # Adam at the model's lr wrecks a pre-trained layer: MiniLM's fine-tuned layers get plm_lr
    vocabs = build_vocabularies(tiny_split.news.values(), kind="wordpiece")
    config = ModelConfig(news_encoder="plm", plm_trainable_layers=layers, num_heads=2,
                         head_dim=4, title_len=6)
    model = build_recommender(config, vocabs)
    groups = parameter_groups(model, TrainConfig(lr=5e-3, plm_lr=2e-5))
    names = {id(p): n for n, p in model.named_parameters()}
    grouped = [[names[id(p)] for p in g["params"]] for g in groups]
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(n for g in grouped for n in g) == sorted(trained)  # each exactly once
    assert groups[0]["lr"] == 5e-3 and "news_encoder.pad" in grouped[0]
    if layers == 0:
        assert len(groups) == 1
    else:
        assert len(groups) == 2 and groups[1]["lr"] == 2e-5
        assert grouped[1] and all(n.startswith("news_encoder.bert.encoder.layer.5.")
                                  for n in grouped[1])
        assert not any(n.startswith("news_encoder.bert.") for n in grouped[0])
