"""PrivateRec training on the federated engine (Alg. 3; docs/privacy.md#paper-and-strict-mode,
#relu-normalisation, #label-privacy).

The client's random inputs (padding, DPA noise, DPL labels), the paper-mode one-backward
round, the strict-mode split of the gradient into candidate and history paths, the events
each mode records, and the configuration defaults.
"""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.method_settings import PrivateRecSettings
from privaterec.errors import ConfigError
from privaterec.fed.client import client_update
from privaterec.fed.methods import (PAPER_MODE_NOTE, method_from_config, resolve_run_config,
                                    uncovered_groups)
from privaterec.fed.objective import ClientBatch
from privaterec.fed.rng import client_noise
from privaterec.runs.report import release_description
from privaterec.fed.simulator import (eligible_clients, sample_round, sequential_round,
                                      simulate_round)
from privaterec.privacy.formulas import amplified_budget


def _objective(make_objective, basis=3, seed=0, **changes):
    return make_objective("nrms", seed=seed, basis_size=basis, **changes)


# ------------------------------------------------------------------------ configuration
def test_privaterec_defaults_fill_basis_padding_and_fedadam():
    config = resolve_run_config(RunConfig(data="x", train=TrainConfig(method="privaterec"),
                                          fed=fed_config("privaterec", epsilon_train=10.0)))
    assert config.model.basis_size == 5
    assert config.fed.settings.padding_p == 0.5
    assert config.fed.strategy == "fedadam"
    # the default is strict mode, whose guarantee holds; it states its clip
    assert config.fed.settings.privacy_mode == "strict"
    assert config.fed.settings.clip == 1e-4
    paper = resolve_run_config(RunConfig(
        data="x", train=TrainConfig(method="privaterec"),
        fed=fed_config("privaterec", epsilon_train=10.0, privacy_mode="paper")))
    assert paper.fed.settings.clip is None  # paper mode clips nothing


@pytest.mark.parametrize("fed,match", [
    ({"clip": 0.1, "privacy_mode": "paper"}, "strict"),
    ({"local_steps": 2}, "local_steps"),
])
def test_privaterec_rejects_settings_that_do_not_apply(fed, match):
    with pytest.raises(ConfigError, match=match):
        resolve_run_config(RunConfig(data="x", train=TrainConfig(method="privaterec"),
                                     fed=fed_config("privaterec", **fed)))


def test_padding_only_for_privaterec():
    with pytest.raises(ConfigError, match="padding_p"):
        resolve_run_config(RunConfig(data="x", train=TrainConfig(method="dp-fedrec"),
                                     fed=fed_config("dp-fedrec", padding_p=0.3)))


def test_invalid_privaterec_options_name_the_parameter():
    with pytest.raises(ConfigError, match="privacy_mode"):
        PrivateRecSettings(privacy_mode="loose")
    with pytest.raises(ConfigError, match="padding_p"):
        PrivateRecSettings(padding_p=1.0)
    with pytest.raises(ConfigError, match="basis_size"):
        ModelConfig(basis_size=-1)


def test_no_padding_without_noise(client_method):
    assert client_method("privaterec").padding_p == 0.0  # ε_t = ∞ by default
    assert client_method("privaterec", epsilon_train=4.0).padding_p == 0.5


# -------------------------------------------------------------------------- client inputs
def test_client_inputs_pad_with_row_zero_and_draw_b_noise(client_method, clients):
    method = client_method("privaterec", epsilon_train=1.0, padding_p=0.6)
    u = 3
    data = clients.client(u)
    inputs = method.draw_inputs(data, basis_size=4, noise=client_noise(0, 0, u))
    padded = (inputs.history != data.history)
    assert bool((inputs.history[padded] == 0).all())
    assert bool(data.history_mask[padded].all())  # only real clicks are padded
    torch.testing.assert_close(inputs.history_mask, data.history_mask)
    assert inputs.attention_noise is not None and inputs.attention_noise.shape == (4,)
    assert bool((inputs.attention_noise != 0).all())
    again = method.draw_inputs(data, basis_size=4, noise=client_noise(0, 0, u))
    torch.testing.assert_close(again.attention_noise, inputs.attention_noise)
    assert torch.equal(again.candidates, inputs.candidates)
    # Every row's candidates come from one of the client's impressions (drawn blind to the
    # clicks, so a row need not hold a clicked news).
    rows, _, counts = data.impressions()
    shown = [set(r[:c].tolist()) for r, c in zip(rows, counts)]
    for row in inputs.candidates.tolist():
        assert any(set(row) <= s for s in shown)


def test_infinite_epsilon_keeps_the_clicked_label_and_adds_no_noise(client_method, clients):
    method = client_method("privaterec")
    data = clients.client(5)
    inputs = method.draw_inputs(data, basis_size=3, noise=client_noise(0, 1, 5))
    assert torch.equal(inputs.history, data.history)
    assert bool((inputs.attention_noise == 0).all())
    # Without label noise, column 0 is a clicked news of the row's impression, and exactly
    # the impressions whose drawn candidates hold a click are kept.
    rows, clicks, counts = data.impressions()
    clicked = [set(r[k].tolist()) for r, k in zip(rows, clicks)]
    assert inputs.candidates.shape[0] >= 1
    for row in inputs.candidates.tolist():
        assert any(row[0] in c and set(row) <= set(r[:n].tolist())
                   for c, r, n in zip(clicked, rows, counts))


def test_dpa_noise_of_a_client_has_the_amplified_laplace_scale(client_method, clients):
    eps, p = 2.0, 0.5
    method = client_method("privaterec", privacy_mode="paper", epsilon_train=eps, padding_p=p)
    data = clients.client(1)
    noise = torch.stack([method.draw_inputs(data, basis_size=5,
                                       noise=client_noise(7, t, 1)).attention_noise
                         for t in range(800)]).double()
    eps_base, _ = amplified_budget(epsilon=eps, delta=0.0, padding_p=p)
    scale = 2.0 / eps_base  # simplex L1 sensitivity 2
    # E|X| = b for Laplace(b); 4000 draws: standard error b/sqrt(4000).
    assert float(noise.abs().mean()) == pytest.approx(scale, abs=5 * scale / math.sqrt(4000))


# ----------------------------------------------------------------------------- gradients
# The published attention, and the centered one at a scale soft enough that this client's
# α + n keeps two positive coordinates (a one-hot ReLU-normalised α̃ has no history path).
@pytest.mark.parametrize("attention", [dict(basis_attention="dot"),
                                       dict(basis_attention="centered", basis_scale=1.0)])
def test_split_gradient_parts_sum_to_the_full_gradient(make_objective, client_method, clients,
                                                       perturb, attention):
    objective = _objective(make_objective, **attention)
    theta = perturb(objective)
    method = client_method("privaterec", privacy_mode="paper", epsilon_train=3.0)
    data = clients.client(2)
    inputs = method.draw_inputs(data, basis_size=3, noise=client_noise(0, 0, 2))
    args = (theta, inputs.history, inputs.history_mask, inputs.candidates)
    full, loss = objective.client_gradient(*args, attention_noise=inputs.attention_noise)
    split, loss2 = objective.client_gradient(*args, attention_noise=inputs.attention_noise,
                                             split_history=True)
    torch.testing.assert_close(split.sum(0), full, rtol=1e-5, atol=1e-7)
    assert loss == pytest.approx(loss2)
    # The candidate path (α̃ held constant) gives the user encoder no gradient at all; the
    # history path reaches it.
    names = objective.spec.names
    offsets = torch.tensor([0, *objective.spec.numels]).cumsum(0)
    user = [i for i, n in enumerate(names) if ".user_encoder." in n]
    assert user
    for i in user:
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        assert bool((split[0, lo:hi] == 0).all())
    assert any(bool(split[1, int(offsets[i]):int(offsets[i + 1])].abs().sum() > 0)
               for i in user)


@pytest.mark.parametrize("mode,fed", [
    ("paper", {"epsilon_train": 2.0, "padding_p": 0.5}),
    ("strict", {"epsilon_train": 2.0, "padding_p": 0.5, "clip": 0.05}),
    ("strict-gaussian", {"epsilon_train": 2.0, "clip": 0.05, "noise": "gaussian"}),
])
def test_simulate_round_equals_sequential_round(mode, fed, make_objective, clients, run_config,
                                                perturb):
    privacy_mode = "paper" if mode == "paper" else "strict"
    config = run_config("privaterec", max_client_samples=3, privacy_mode=privacy_mode, **fed)
    method = method_from_config(config)
    objective = _objective(make_objective)
    theta = perturb(objective)
    selected = sample_round(eligible_clients(clients), 8, seed=4, round_index=1)
    fast = simulate_round(objective, theta, clients, selected, method, seed=4, round_index=1,
                          chunk_clients=3)
    slow = sequential_round(objective, theta, clients, selected, method, seed=4, round_index=1)
    torch.testing.assert_close(fast.direction, slow.direction, rtol=1e-4, atol=1e-6)
    assert fast.events == slow.events == [method.events(objective.dimension)] * 8
    assert fast.direction.abs().max() > 0


def test_paper_round_uses_each_clients_noise(make_objective, clients, client_method):
    """The one-backward round equals the weighted mean of per-client gradients computed with
    each client's own padded history, DPA noise and DPL labels."""
    method = client_method("privaterec", epsilon_train=1.0)
    objective = _objective(make_objective)
    theta = objective.parameters()
    users = [0, 4, 9, 11]
    inputs = [method.draw_inputs(clients.client(u), basis_size=3,
                            noise=client_noise(1, 0, u)) for u in users]
    batch = ClientBatch.stack([x.history for x in inputs], [x.history_mask for x in inputs],
                              [x.candidates for x in inputs],
                              [x.attention_noise for x in inputs])
    g, _ = objective.round_gradient(theta, batch)
    counts = torch.tensor([x.candidates.shape[0] for x in inputs], dtype=torch.float32)
    per = torch.stack([objective.client_gradient(theta, x.history, x.history_mask,
                                                 x.candidates,
                                                 attention_noise=x.attention_noise)[0]
                       for x in inputs])
    torch.testing.assert_close(g, (counts[:, None] * per).sum(0) / counts.sum(),
                               rtol=1e-4, atol=1e-7)
    # A private method's server weighs clients equally (a client without kept samples
    # contributes 0): the uniform round gradient is the plain mean of the client gradients.
    uniform, _ = objective.round_gradient(theta, batch, uniform_clients=True)
    torch.testing.assert_close(uniform, per.mean(0), rtol=1e-4, atol=1e-7)
    # Without the noise the round gradient differs: the noise really enters the loss.
    clean = ClientBatch.stack([x.history for x in inputs], [x.history_mask for x in inputs],
                              [x.candidates for x in inputs],
                              [torch.zeros(3) for _ in inputs])
    assert not torch.allclose(objective.round_gradient(theta, clean)[0], g)


# -------------------------------------------------------------------------------- events
def test_paper_mode_event_is_marked_not_covering_the_upload(client_method):
    method = client_method("privaterec", privacy_mode="paper", epsilon_train=10.0, padding_p=0.5)
    dpa, labels, shown = method.events(1000)
    assert dpa.epsilon == 10.0 and dpa.padding_p == 0.5 and dpa.phase == "train"
    assert dpa.sensitivity == 2.0  # simplex L1 sensitivity, not the paper's θ
    assert dpa.valid is False and dpa.note == PAPER_MODE_NOTE
    assert dpa.data == "history" and labels.data == "labels"
    assert labels.mechanism == "randomized_response" and labels.epsilon == 10.0
    assert shown.epsilon == 0.0 and shown.epsilon_user == math.inf


def test_strict_mode_splits_the_budget_between_dpa_and_the_history_gradient(client_method):
    method = client_method("privaterec", epsilon_train=10.0, privacy_mode="strict",
                           history_budget=0.3, clip=0.01)
    dpa, hist, labels, shown = method.events(500)
    assert dpa.valid and hist.valid and labels.valid
    assert (dpa.data, hist.data, labels.data) == ("history", "history", "labels")
    assert hist.at_adjacency("user").epsilon == hist.epsilon  # the clip bounds any change
    assert dpa.epsilon == pytest.approx(7.0) and hist.epsilon == pytest.approx(3.0)
    assert hist.sensitivity == pytest.approx(0.02) and hist.dimension == 500
    assert hist.noise_scale == pytest.approx(0.02 / 3.0)


def test_strict_update_noise_follows_the_history_gradient_budget(make_objective, clients,
                                                                client_method):
    """The strict upload is candidate-path gradient + clipped history-path gradient +
    Laplace(2·clip/ε_h): its deviation from the noiseless split has that scale."""
    objective = _objective(make_objective)
    theta = objective.parameters()
    method = client_method("privaterec", epsilon_train=4.0, privacy_mode="strict", clip=0.01)
    data = clients.client(3)
    gen = client_noise(2, 0, 3)
    update = client_update(objective, theta, data, method, noise=gen)
    inputs = method.draw_inputs(data, basis_size=3, noise=client_noise(2, 0, 3))
    split, _ = objective.client_gradient(theta, inputs.history, inputs.history_mask,
                                         inputs.candidates,
                                         attention_noise=inputs.attention_noise,
                                         split_history=True)
    noise = update.payload - split[0] - split[1] / max(1.0, float(split[1].abs().sum()) / 0.01)
    scale = 2 * 0.01 / 2.0
    d = objective.dimension
    assert float(noise.abs().mean()) == pytest.approx(scale, rel=6 / math.sqrt(d))
    assert [e.epsilon for e in update.privacy_events] == [2.0, 2.0, 4.0, 0.0]


def test_release_description_names_uncovered_parameters(client_method, make_objective):
    objective = _objective(make_objective)
    names = objective.parameter_names()
    method = client_method("privaterec", privacy_mode="paper", epsilon_train=10.0)
    release = release_description(method, dimension=objective.dimension,
                                  noised_parameters=names, clients_per_round=4,
                                  client_fraction=0.1)
    assert release["privacy_mode"] == "paper"
    groups = release["uncovered_parameters"]
    assert groups == uncovered_groups(names)
    assert any(g.startswith("basis") for g in groups)
    assert any(g.startswith("user_encoder") for g in groups)
    assert release["dpa"]["sensitivity"] == 2.0
    strict = client_method("privaterec", epsilon_train=10.0, privacy_mode="strict")
    rel = release_description(strict, dimension=objective.dimension,
                              noised_parameters=names, clients_per_round=4,
                                  client_fraction=0.1)
    assert rel["uncovered_parameters"] == []
    assert rel["history_gradient"]["epsilon"] == pytest.approx(5.0)


def test_paper_mode_keeps_the_paper_sensitivity_warning(client_method):
    """With sensitivity_mode='paper' in paper mode, the paper-mode note
    overwrote the note that the sensitivity itself is invalid."""
    from privaterec.privacy.dpa import PAPER_MODE_NOTE as SENSITIVITY_NOTE
    method = client_method("privaterec", privacy_mode="paper", epsilon_train=4.0,
                           sensitivity_mode="paper")
    dpa = method.events(100)[0]
    assert not dpa.valid
    assert SENSITIVITY_NOTE in dpa.note and PAPER_MODE_NOTE in dpa.note


def test_report_states_adjacency_and_warns_about_user_level(client_method):
    """The report opens with the adjacency of every total and prints both
    the click-level and the user-level totals; PrivateRec's candidate sets get a WARNING."""
    from privaterec.privacy.ledger import PrivacyLedger
    from privaterec.privacy.report import build_privacy_summary, format_privacy_report
    method = client_method("privaterec", epsilon_train=2.0, privacy_mode="strict")
    ledger = PrivacyLedger()
    for _ in range(3):
        for event in method.events(50):
            ledger.record("u1", event)
    release = release_description(method, dimension=50, noised_parameters=["a.w"],
                                  clients_per_round=1, client_fraction=0.5)
    text = format_privacy_report(build_privacy_summary(ledger, release=release, delta=1e-5,
                                                       rounds=3))
    assert "Adjacency: every epsilon below is stated for one of" in text
    assert "[click-level] total epsilon per user" in text
    assert "[user-level] total epsilon per user   max ∞" in text
    assert "NOT for a whole user" in text.split("Privacy report")[0]  # in the WARNINGS block
    # One click per round costs max(eps_DPA + eps_hist, eps_label) = 2, three rounds: 6.
    assert ledger.user_epsilon("u1", delta=0.0, composition="basic") == pytest.approx(6.0)
    assert ledger.user_epsilon("u1", delta=0.0, composition="basic",
                               adjacency="user") == math.inf
