"""Each method's settings (privaterec.method_settings) and the legacy reader of flat configs.

``tests/fixtures/legacy_configs/`` holds ``config.yaml`` and ``recall.yaml`` files written by
the code before the settings moved to ``fed.settings`` (a flat FedConfig, written by
that code's ``RunConfig.to_yaml`` after ``resolve_run_config``; ``dp-fedavg-adaptive.yaml`` and
``dp-fedavg-secagg.yaml`` also hold adaptive clipping's and secure aggregation's flat keys). They must load, give the configuration the current code resolves from the
same options, and build the very method the old code built (its repr, recorded when the
files were written; DP-FedAvg's fields added after a file was written appear at their
defaults: off).
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
import pytest

from privaterec.config import (FedConfig, ModelConfig, RunConfig, TrainConfig, fed_config,
                               fed_with_changes)
from privaterec.errors import CheckpointError, ConfigError
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.method_settings import (DPFedAvgSettings, DPFedRecSettings, FedRecSettings,
                                        PrivateRecSettings, UniFedRecSettings)

LEGACY = Path(__file__).parent / "fixtures" / "legacy_configs"
# DP-FedAvg's fields added after a file was written, at their defaults (off).
NO_SECAGG = (", secure_aggregation='none', noise_placement='central', max_dropouts=0, "
             "clip_space='parameters'")

# file → (method, the options it was trained with, the method the old code built)
LEGACY_RUNS = {
    "fedrec": ("fedrec", {},
               "FedRec(negatives=4, max_samples=64, local_steps=1, local_lr=0.05)"),
    "fednewsrec": ("fednewsrec", {"clip": 0.01},
                   "FedNewsRec(negatives=4, max_samples=64, local_steps=1, local_lr=0.05, "
                   "clip=0.01, noise_scale=0.015)"),
    "dp-fedrec": ("dp-fedrec", {"epsilon_train": 2.0, "noise": "gaussian",
                                "delta_train": 1e-6, "clip": 0.02},
                  "DPFedRec(negatives=4, max_samples=64, local_steps=1, local_lr=0.05, "
                  "clip=0.02, noise='gaussian', epsilon=2.0, delta=1e-06)"),
    "privaterec": ("privaterec", {"epsilon_train": 10.0, "privacy_mode": "strict",
                                  "history_budget": 0.3},
                   "PrivateRecStrict(negatives=4, max_samples=64, local_steps=1, "
                   "local_lr=0.05, noise='laplace', epsilon=10.0, delta=0.0, padding_p=0.5, "
                   "sensitivity_mode='true', clip=0.0001, history_budget=0.3)"),
    "privaterec-paper": ("privaterec", {"epsilon_train": 10.0, "padding_p": 0.3,
                                        "privacy_mode": "paper"},
                         "PrivateRec(negatives=4, max_samples=64, local_steps=1, "
                         "local_lr=0.05, noise='laplace', epsilon=10.0, delta=0.0, "
                         "padding_p=0.3, sensitivity_mode='true')"),
    "dp-fedavg": ("dp-fedavg", {"target_epsilon": 8.0, "client_fraction": 0.1, "rounds": 20},
                  "CentralDP(negatives=4, max_samples=64, inner=FedRec(negatives=4, "
                  "max_samples=64, local_steps=1, local_lr=0.05), clip=0.1, "
                  "noise_multiplier=0.73046875, sampling_rate=0.1, rounds=20, delta=1e-05, "
                  "adaptive=None" + NO_SECAGG + ")"),
    "dp-fedavg-adaptive": ("dp-fedavg", {"noise_multiplier": 1.0, "client_fraction": 0.25,
                                         "clip": 0.05, "adaptive_clip_quantile": 0.5,
                                         "clip_count_stddev": 1.0, "rounds": 6},
                           "CentralDP(negatives=4, max_samples=64, inner=FedRec(negatives=4, "
                           "max_samples=64, local_steps=1, local_lr=0.05), clip=0.05, "
                           "noise_multiplier=1.0, sampling_rate=0.25, rounds=6, delta=1e-05, "
                           "adaptive=AdaptiveClipping(target_quantile=0.5, learning_rate=0.2, "
                           "count_stddev=1.0)" + NO_SECAGG + ")"),
    "dp-fedavg-secagg": ("dp-fedavg", {"noise_multiplier": 1.0, "client_fraction": 0.5,
                                       "target_delta": 1e-3, "engine": "flower",
                                       "secure_aggregation": "secaggplus",
                                       "noise_placement": "distributed", "max_dropouts": 1,
                                       "rounds": 2},
                         "CentralDP(negatives=4, max_samples=64, inner=FedRec(negatives=4, "
                         "max_samples=64, local_steps=1, local_lr=0.05), clip=0.1, "
                         "noise_multiplier=1.0, sampling_rate=0.5, rounds=2, delta=0.001, "
                         "adaptive=None, secure_aggregation='secaggplus', "
                         "noise_placement='distributed', max_dropouts=1, "
                         "clip_space='parameters')"),
}


@pytest.mark.parametrize("name", sorted(LEGACY_RUNS))
def test_legacy_flat_config_yaml_loads_as_the_same_run(name, tmp_path):
    method, options, built = LEGACY_RUNS[name]
    path = LEGACY / f"{name}.yaml"
    assert "settings" not in path.read_text()  # the old, flat format
    loaded = RunConfig.from_yaml(path)
    now = resolve_run_config(RunConfig(data="/data", model=ModelConfig(num_heads=2, head_dim=4),
                                       train=TrainConfig(method=method, seed=3),
                                       fed=fed_config(method, **options)))
    if now.model.basis_size:  # saved before the option: the published attention
        assert loaded.model.basis_attention == "dot"
        now = dataclasses.replace(now, model=dataclasses.replace(now.model,
                                                                 basis_attention="dot"))
    assert loaded == now  # a resumed run is recognised as the same run
    assert resolve_run_config(loaded) == loaded  # it states every value used
    assert repr(method_from_config(loaded)) == built
    loaded.to_yaml(tmp_path / "config.yaml")  # rewritten in the new format, same run
    assert "\n  settings:" in (tmp_path / "config.yaml").read_text()
    assert RunConfig.from_yaml(tmp_path / "config.yaml") == loaded


def test_legacy_centralized_config_yaml_has_no_settings():
    loaded = RunConfig.from_yaml(LEGACY / "centralized.yaml")
    assert loaded.train.method == "centralized" and loaded.fed.settings is None
    assert loaded == RunConfig(data="/data")


def test_legacy_recall_yaml_moves_train_clipping_into_the_settings():
    from privaterec.runs.recall_setup import RecallRunConfig

    loaded = RecallRunConfig.from_yaml(LEGACY / "unifedrec-recall.yaml")
    assert loaded.fed.settings == UniFedRecSettings(clipping="none", clip=0.1, noise_scale=0.0)
    assert (loaded.fed.rounds, loaded.fed.clients_per_round, loaded.fed.server_lr) == (5, 4, 0.05)
    assert loaded.resolved() == loaded
    assert repr(loaded.method()) == ("UniFedRecLDP(negatives=4, max_samples=64, "
                                     "clipping='none', clip=0.1, noise_scale=0.0)")


def test_legacy_keys_and_settings_cannot_be_mixed(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text("train:\n  method: dp-fedrec\nfed:\n  clip: 0.1\n  settings:\n"
                    "    epsilon_train: 1.0\n")
    with pytest.raises(ConfigError, match=r"mixed\.yaml: 'fed\.settings' and the flat keys fed\.clip "):
        RunConfig.from_yaml(path)


def test_privaterec_strict_mode_states_its_clip_and_paper_mode_refuses_one():
    assert PrivateRecSettings(privacy_mode="strict").clip == 1e-4
    assert PrivateRecSettings(privacy_mode="strict", clip=0.01).clip == 0.01
    assert PrivateRecSettings().privacy_mode == "strict"  # the default: a valid guarantee
    assert PrivateRecSettings().clip == 1e-4
    assert PrivateRecSettings(privacy_mode="paper").clip is None
    with pytest.raises(ConfigError, match="strict"):
        PrivateRecSettings(privacy_mode="paper", clip=0.01)


def test_dp_fedavg_needs_its_epsilon_or_its_noise_multiplier():
    with pytest.raises(ConfigError, match="target_epsilon.*noise_multiplier"):
        DPFedAvgSettings()
    with pytest.raises(ConfigError, match="target_epsilon"):
        RunConfig(train=TrainConfig(method="dp-fedavg"))
    assert DPFedAvgSettings(noise_multiplier=1.0).target_delta == 1e-5


def test_unifedrec_refuses_noise_on_an_unclipped_upload():
    with pytest.raises(ConfigError, match="clipping 'none'"):
        UniFedRecSettings(clipping="none")
    assert UniFedRecSettings(clipping="none", noise_scale=0.0).noise_scale == 0.0


def test_flat_changes_name_the_flags_a_method_has():
    with pytest.raises(ConfigError, match=r"--noise-scale does not apply to dp-fedrec \(its "
                                          r"settings: --clip, --noise, --epsilon-train"):
        fed_with_changes(FedConfig(), "dp-fedrec", {"noise_scale": 0.1},
                         name=lambda k: "--" + k.replace("_", "-"))
    with pytest.raises(ConfigError, match="no settings of its own"):
        fed_config("fedrec", epsilon_train=1.0)
    fed = fed_config("dp-fedrec", rounds=3, epsilon_train=1.0)
    assert (fed.rounds, fed.settings) == (3, DPFedRecSettings(epsilon_train=1.0))


def test_switching_the_method_carries_over_the_settings_it_shares():
    """E.g. a --config of one method and --method another (the CLI): values that differ from
    their defaults carry over when the new method has them, and are refused otherwise."""
    dp = fed_config("dp-fedrec", epsilon_train=2.0, noise="gaussian")
    private = fed_with_changes(dp, "privaterec", {})
    assert private.settings == PrivateRecSettings(epsilon_train=2.0, noise="gaussian")
    assert fed_with_changes(fed_config("dp-fedrec"), "fedrec", {}).settings == FedRecSettings()
    with pytest.raises(ConfigError, match="'fed.settings.noise' of dp-fedrec, "
                                          "'fed.settings.epsilon_train' of dp-fedrec do not "
                                          "apply to fedrec"):
        fed_with_changes(dp, "fedrec", {})


def test_a_recall_checkpoint_of_the_flat_format_resumes_under_the_same_settings(tmp_path):
    """A recall checkpoint stores its settings to refuse a resume under others; one written
    before the settings moved (``fed.clip``, ``train.clipping``) is compared key by key."""
    import dataclasses

    import torch

    from privaterec.recall.task import (CHECKPOINT_KIND, RecallTrainConfig, _check_resumable,
                                        recall_fed_config, resolve_recall_fed)

    fed, train = resolve_recall_fed(recall_fed_config(rounds=4)), RecallTrainConfig()
    new = {"fed": dataclasses.asdict(fed), "train": dataclasses.asdict(train)}
    flat = {k: v for k, v in new["fed"].items() if k != "settings"}
    old = {"fed": {**flat, "clip": 0.1, "noise_scale": 0.01, "epsilon_train": float("inf")},
           "train": {**new["train"], "clipping": "l1"}}
    saved = {"kind": CHECKPOINT_KIND, "params": torch.zeros(3), "config": old, "seed": 0}
    _check_resumable(saved, new, 0, 3, tmp_path / "c.pt")  # the same run: no error
    other = {"fed": dataclasses.asdict(dataclasses.replace(
        fed, settings=UniFedRecSettings(clipping="elementwise"))), "train": new["train"]}
    with pytest.raises(CheckpointError, match="fed.settings.clipping"):
        _check_resumable(saved, other, 0, 3, tmp_path / "c.pt")


def test_a_run_saved_before_the_basis_attention_option_loads_as_the_published_attention(
        tmp_path):
    """Configurations saved before 'model.basis_attention' existed were trained with
    the dot-product attention; they load as such (the default is now 'centered'), while a
    hand-written partial 'model' section gets the default."""
    import yaml

    from privaterec.config import RunConfig

    saved = yaml.safe_load((LEGACY / "privaterec.yaml").read_text())
    assert "basis_attention" not in saved["model"] and saved["model"]["basis_size"] > 0
    assert RunConfig.from_dict(saved).model.basis_attention == "dot"
    partial = {"model": {"basis_size": 5}, "train": {"method": "privaterec"}}
    assert RunConfig.from_dict(partial).model.basis_attention == "centered"
    current = RunConfig.from_dict(saved).to_dict()  # saved by this version: kept as written
    current["model"]["basis_attention"] = "centered"
    assert RunConfig.from_dict(current).model.basis_attention == "centered"


def test_every_declared_method_has_one_class_in_the_registry(monkeypatch):
    # a method is its settings (method_settings.SETTINGS) and one class in fed/methods/,
    # found there by the registry; a declared method without a class is refused
    import dataclasses

    from privaterec import method_settings
    from privaterec.fed.methods import CLASSES, METHODS
    from privaterec.fed.methods.registry import _method_classes
    from privaterec.method_settings import RANKING_METHODS, SETTINGS, MethodSettings

    assert list(CLASSES) == list(SETTINGS) and list(METHODS) == list(RANKING_METHODS)
    assert all(cls.settings_type is SETTINGS[name] for name, cls in CLASSES.items())
    assert CLASSES["unifedrec"].settings_type.task == "recall"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Orphan(MethodSettings):
        method = "orphan"

    monkeypatch.setitem(method_settings.SETTINGS, "orphan", Orphan)
    with pytest.raises(TypeError, match="orphan"):
        _method_classes()
