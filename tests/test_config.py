import types
import typing

import pytest

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig, from_mapping
from privaterec.errors import ConfigError
from privaterec.validators import check_choice


def test_defaults_are_valid_and_news_dim_is_heads_times_head_dim():
    config = ModelConfig()
    assert config.news_dim == config.num_heads * config.head_dim
    assert config.resolved_user_encoder == "nrms"
    assert ModelConfig(news_encoder="fednewsrec").resolved_user_encoder == "fednewsrec"
    assert ModelConfig(news_encoder="naml", user_encoder="lstur").resolved_user_encoder == "lstur"


@pytest.mark.parametrize("kwargs, name", [
    ({"news_encoder": "bert"}, "news_encoder"),
    ({"num_heads": 0}, "num_heads"),
    ({"dropout": 1.0}, "dropout"),
    ({"embeddings": "word2vec"}, "embeddings"),
])
def test_invalid_model_values_name_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        ModelConfig(**kwargs)


def test_word_dim_follows_pretrained_embeddings_and_conflicts_are_errors():
    assert ModelConfig().resolved_word_dim == 64
    assert ModelConfig(word_dim=32).resolved_word_dim == 32
    assert ModelConfig(embeddings="glove50").resolved_word_dim == 50
    assert ModelConfig(embeddings="minilm", word_dim=384).resolved_word_dim == 384
    with pytest.raises(ConfigError, match="word_dim.*glove50.*50-d"):
        ModelConfig(embeddings="glove50", word_dim=64)
    with pytest.raises(ConfigError, match="word_dim"):
        ModelConfig(word_dim=0)


@pytest.mark.parametrize("kwargs, name", [
    ({"method": "magic"}, "method"), ({"lr": -1.0}, "lr"), ({"batch_size": 0}, "batch_size"),
])
def test_invalid_train_values_name_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        TrainConfig(**kwargs)


def test_yaml_round_trip(tmp_path):
    config = RunConfig(data="/x", model=ModelConfig(news_encoder="naml", dropout=0.1),
                       train=TrainConfig(epochs=7, lr=0.01))
    path = tmp_path / "c.yaml"
    config.to_yaml(path)
    assert RunConfig.from_yaml(path) == config


def test_yaml_unknown_key_and_wrong_type_are_reported_with_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  news_encoder: nrms\n  heads: 4\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*model\.heads"):
        RunConfig.from_yaml(path)
    path.write_text("train:\n  epochs: three\n")
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        RunConfig.from_yaml(path)
    path.write_text("train:\n  lr: 1\n")  # an int is accepted for a float
    assert RunConfig.from_yaml(path).train.lr == 1.0


def _literal_fields(cls: type) -> dict[str, tuple[str, ...]]:
    """Field name → the values of its ``Literal`` type (``Literal[...] | None`` included)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        for arg in typing.get_args(hint) if union else (hint,):
            if typing.get_origin(arg) is typing.Literal:
                out[name] = typing.get_args(arg)
    return out


@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig, FedConfig])
def test_literal_choice_fields_accept_exactly_their_values(cls):
    fields = _literal_fields(cls)
    assert fields, f"{cls.__name__} has no Literal choice field"
    for name, values in fields.items():
        for value in values:  # the validator accepts every value the type admits ...
            assert getattr(cls(**{name: value}), name) == value
        with pytest.raises(ConfigError, match=name):  # ... and nothing else
            cls(**{name: "no-such-choice"})
        with pytest.raises(ConfigError, match=name):  # YAML values too
            from_mapping(cls, {name: "no-such-choice"})


def test_check_choice_narrows_or_names_the_choices():
    assert check_choice("fedadam", "strategy", ("sgd", "fedavg", "fedadam")) == "fedadam"
    with pytest.raises(ConfigError, match="'strategy': got 'adam', expected one of sgd, fedavg"):
        check_choice("adam", "strategy", ("sgd", "fedavg", "fedadam"))
