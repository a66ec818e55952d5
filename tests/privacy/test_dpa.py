"""Tests of privaterec.privacy.dpa: behaviour padding, DPA noise, normalisation, VDP.

Expected values are computed independently in the tests (PrivateRec Alg. 2-3;
docs/privacy.md: DPA sensitivity, padding amplification, Gaussian calibration, ReLU
normalisation, label privacy), and every privacy claim is also checked by an empirical audit
(Clopper–Pearson lower bound on ε below the claim; a deliberately broken variant above it).

One test is the regression test of a bug these audits found (NaN from softplus normalisation
when every coordinate underflows).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privaterec.errors import ConfigError
from privaterec.privacy.audit import audit_mechanism
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.privacy.dpa import (
    PAPER_MODE_NOTE,
    dpa_calibration,
    dpa_noise,
    pad_history,
    padding_mask,
    permute_columns,
    relu_normalize,
    softplus_normalize,
    vdp_calibration,
    vdp_release,
)
from privaterec.privacy.mechanisms import CLIP_MARGIN
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

F64 = torch.float64


def _source(generator) -> NoiseSource:
    """A test's randomness as a source: a source itself, or seeded generator(s) wrapped."""
    return generator if isinstance(generator, NoiseSource) else SimulationNoise(generator)


def _dpa_noise(shape, *, generator, dtype=torch.float32, **params):
    """DPA noise ``[m, B]`` and the event of one row: calibrated once, then drawn."""
    calibration = dpa_calibration(dimension=shape[-1], **params)
    noise = dpa_noise(shape, calibration, noise=_source(generator), dtype=dtype)
    return noise, calibration.event


def _vdp_release(user, *, generator, **params):
    """VDP releases ``[m, d]`` and the event of one row: calibrated once, then released."""
    calibration = vdp_calibration(dimension=user.shape[-1], **params)
    return vdp_release(user, calibration, noise=_source(generator)), calibration.event


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sim(seed: int) -> SimulationNoise:
    """:func:`gen` as the noise source a client draw takes."""
    return SimulationNoise(gen(seed))


def eps_prime(eps: float, p: float) -> float:
    """ε′ = ln((e^ε − p)/(1 − p)) (PrivateRec Alg. 2 line 9;
    docs/privacy.md#padding-amplification)."""
    return math.log((math.exp(eps) - p) / (1.0 - p))


# --- behaviour padding (Alg. 2 lines 2-5) ------------------------------------------------------

def test_padding_mask_never_pads_non_clicks_and_pads_at_rate_p():
    mask = torch.rand(4000, 50, generator=gen(0)) < 0.6
    n = int(mask.sum())
    for p, seed in ((0.3, 1), (0.7, 2)):
        pad = padding_mask(mask, padding_p=p, noise=sim(seed))
        assert pad.dtype == torch.bool and pad.shape == mask.shape
        assert not bool((pad & ~mask).any())  # never a position without a click
        count = int(pad.sum())
        assert abs(count - n * p) < 5 * math.sqrt(n * p * (1 - p))  # Binomial(n, p)
    # A history without clicks is never padded, even at a high p.
    assert not bool(padding_mask(torch.zeros(10, 5, dtype=torch.bool), padding_p=0.9,
                                 noise=sim(3)).any())


def test_padding_mask_per_row_generators_and_p_zero():
    mask = torch.ones(5, 8, dtype=torch.bool)
    mask[1, 6:] = False
    mask[3, :2] = False
    seeds = (10, 11, 12, 13, 14)
    pad = padding_mask(mask, padding_p=0.4, noise=SimulationNoise([gen(s) for s in seeds]))
    for i, s in enumerate(seeds):
        # Row i is the draw of generator i alone: U < p on that row's clicks.
        expected = (torch.rand(8, generator=gen(s), dtype=F64) < 0.4) & mask[i]
        assert torch.equal(pad[i], expected)
        assert torch.equal(pad[i], padding_mask(mask[i], padding_p=0.4, noise=sim(s)))
    assert pad.any() and not pad.all()
    with pytest.raises(ConfigError, match="one generator per row"):
        padding_mask(mask, padding_p=0.4, noise=SimulationNoise([gen(0), gen(1)]))
    assert not bool(padding_mask(mask, padding_p=0.0, noise=sim(4)).any())
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="padding_p"):
            padding_mask(mask, padding_p=bad, noise=sim(5))


def test_pad_history_puts_the_anonymous_row_exactly_where_padded():
    rows = torch.arange(1, 16, dtype=torch.long).reshape(3, 5)
    before = rows.clone()
    pad = torch.tensor([[True, False, False, True, False],
                        [False, False, False, False, False],
                        [True, True, True, True, True]])
    out = pad_history(rows, pad)
    assert out.dtype == torch.long
    assert torch.equal(out[pad], torch.zeros(int(pad.sum()), dtype=torch.long))
    assert torch.equal(out[~pad], rows[~pad])
    assert torch.equal(rows, before)  # not modified in place
    out7 = pad_history(rows, pad, anonymous_row=7)
    assert torch.equal(out7, torch.where(pad, 7, rows))


# --- DPA noise (Alg. 2 line 9; docs/privacy.md) ---------------------------------------------

def test_dpa_laplace_noise_scale_is_two_over_amplified_epsilon():
    eps, p = 1.0, 0.3
    b = 2.0 / eps_prime(eps, p)  # L1 sensitivity of the simplex = 2 (docs/privacy.md#dpa-sensitivity)
    noise, event = _dpa_noise((50_000, 4), epsilon=eps, padding_p=p, generator=gen(20),
                             dtype=F64)
    x = noise.numpy().ravel()
    n = x.size
    assert noise.shape == (50_000, 4) and noise.dtype == F64
    assert event.noise_scale == pytest.approx(b, rel=1e-12)
    # |X| ~ Exp(b): mean b, sd b.
    assert abs(np.abs(x).mean() - b) < 5 * b / math.sqrt(n)
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3
    # The KS test has power against the unamplified scale 2/ε (padding ignored).
    assert stats.kstest(x, stats.laplace(scale=2.0 / eps).cdf).pvalue < 1e-6
    assert event.mechanism == "laplace" and event.epsilon == eps and event.delta == 0.0
    assert event.padding_p == p and event.sensitivity == 2.0
    assert event.valid and event.dimension == 4 and event.phase == "train"
    assert event.is_private


def test_dpa_gaussian_noise_uses_analytic_sigma_at_the_amplified_budget():
    eps, delta, p = 1.0, 1e-5, 0.3
    e1, d1 = eps_prime(eps, p), delta / (1 - p)
    sigma = gaussian_sigma(epsilon=e1, delta=d1, sensitivity_l2=math.sqrt(2))
    # Independent check of σ: Balle & Wang Thm 8 holds with equality at (ε′, δ′, Δ₂ = √2).
    dl = math.sqrt(2)
    lhs = (stats.norm.cdf(dl / (2 * sigma) - e1 * sigma / dl)
           - math.exp(e1) * stats.norm.cdf(-dl / (2 * sigma) - e1 * sigma / dl))
    assert lhs == pytest.approx(d1, rel=1e-6)
    noise, event = _dpa_noise((50_000, 4), epsilon=eps, delta=delta, padding_p=p,
                             mechanism="gaussian", generator=gen(21), dtype=F64, phase="serve")
    x = noise.numpy().ravel()
    assert event.noise_scale == pytest.approx(sigma, rel=1e-9)
    assert abs(x.std() - sigma) < 5 * sigma / math.sqrt(2 * x.size)
    assert stats.kstest(x, stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert event.mechanism == "gaussian" and event.epsilon == eps and event.delta == delta
    assert event.padding_p == p and event.sensitivity == pytest.approx(math.sqrt(2))
    assert event.phase == "serve" and event.valid
    # Padding lowers σ compared with the same target without padding.
    _, unpadded = _dpa_noise((1, 4), epsilon=eps, delta=delta, mechanism="gaussian",
                            generator=gen(22))
    assert unpadded.noise_scale == pytest.approx(
        gaussian_sigma(epsilon=eps, delta=delta, sensitivity_l2=math.sqrt(2)), rel=1e-9)
    assert event.noise_scale < unpadded.noise_scale


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_dpa_noise_scale_falls_with_p_exactly_as_the_formula(eps):
    ps = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    scales = []
    for p in ps:
        _, event = _dpa_noise((1, 5), epsilon=eps, padding_p=p, generator=gen(23))
        assert event.noise_scale == pytest.approx(2.0 / eps_prime(eps, p), rel=1e-12)
        scales.append(event.noise_scale)
    assert scales[0] == pytest.approx(2.0 / eps, rel=1e-15)
    assert all(a > b for a, b in zip(scales, scales[1:]))


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_dpa_paper_sensitivity_is_theta_and_marked_invalid(mechanism):
    eps, delta, p = 1.0, (0.0 if mechanism == "laplace" else 1e-5), 0.5
    noise, event = _dpa_noise((20_000, 5), epsilon=eps, delta=delta, padding_p=p,
                             mechanism=mechanism, sensitivity="paper", generator=gen(24),
                             dtype=F64)
    if mechanism == "laplace":
        expected = 1.0 / eps_prime(eps, p)  # S = θ = 1 instead of 2
        assert noise.abs().mean().item() == pytest.approx(expected, rel=0.03)
    else:
        expected = gaussian_sigma(epsilon=eps_prime(eps, p), delta=delta / (1 - p),
                                  sensitivity_l2=1.0)
        assert noise.std().item() == pytest.approx(expected, rel=0.03)
    assert event.noise_scale == pytest.approx(expected, rel=1e-9)
    assert event.valid is False
    assert event.note == PAPER_MODE_NOTE and "NOT a valid" in event.note


@pytest.mark.parametrize("mechanism,delta", [("laplace", 0.0), ("gaussian", 1e-5)])
def test_dpa_infinite_epsilon_gives_zero_noise_and_non_private_event(mechanism, delta):
    noise, event = _dpa_noise((3, 4), epsilon=math.inf, delta=delta, padding_p=0.2,
                             mechanism=mechanism, generator=gen(25))
    assert torch.equal(noise, torch.zeros(3, 4))
    assert not event.is_private and math.isinf(event.epsilon)


def test_dpa_noise_validation_and_per_row_generators():
    with pytest.raises(ConfigError, match="'delta'"):
        _dpa_noise((2, 3), epsilon=1.0, delta=1e-5, generator=gen(0))
    with pytest.raises(ConfigError, match="delta"):
        _dpa_noise((2, 3), epsilon=1.0, delta=0.0, mechanism="gaussian", generator=gen(0))
    with pytest.raises(ConfigError, match="mechanism"):
        _dpa_noise((2, 3), epsilon=1.0, mechanism="exponential", generator=gen(0))
    with pytest.raises(ConfigError, match="shape"):
        _dpa_noise((6,), epsilon=1.0, generator=gen(0))
    with pytest.raises(ConfigError, match="padding_p"):
        _dpa_noise((2, 3), epsilon=1.0, padding_p=1.0, generator=gen(0))
    seeds = (30, 31, 32)
    rows, _ = _dpa_noise((3, 6), epsilon=1.0, padding_p=0.5, generator=[gen(s) for s in seeds])
    for i, s in enumerate(seeds):
        alone, _ = _dpa_noise((1, 6), epsilon=1.0, padding_p=0.5, generator=[gen(s)])
        assert torch.equal(rows[i], alone[0])
    assert not torch.equal(rows[0], rows[1])


# --- normalisation (Alg. 2 line 10; §3.3; docs/privacy.md#relu-normalisation) ------------------

def test_softplus_normalize_rows_are_on_the_simplex():
    x = torch.randn(64, 7, generator=gen(40), dtype=F64) * 5
    x[0, 0] = 40.0  # beyond softplus' linear threshold
    out = softplus_normalize(x)
    sp = np.logaddexp(0.0, x.numpy())  # softplus computed independently
    np.testing.assert_allclose(out.numpy(), sp / sp.sum(axis=1, keepdims=True), rtol=1e-12)
    assert (out > 0).all()
    np.testing.assert_allclose(out.sum(dim=-1).numpy(), 1.0, rtol=1e-12)


def test_softplus_normalize_stays_finite_when_every_coordinate_underflows():
    """Regression (dpa.softplus_normalize): 0/0 = NaN when softplus underflowed everywhere.

    softplus(x) == 0 for x < ~-104 in float32 (< ~-745 in float64), so a row of α + n whose
    coordinates are all that negative gives Σ softplus = 0 and a NaN release. Serving uses
    float32 and Laplace noise of scale 2/ε′ (200 at ε_s = 0.01), where such rows occur
    (probability ~0.3^B per query at ε_s = 0.01). The limit of the formula as x → −∞ is
    softmax(x) (softplus(x) ~ e^x); a log-space evaluation gives it.
    """
    x = torch.tensor([[-200.0, -150.0, -300.0], [0.5, 0.2, -0.1]])
    out = softplus_normalize(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], torch.softmax(x[0].double(), dim=-1).float())
    torch.testing.assert_close(out.sum(dim=-1), torch.ones(2))


def test_relu_normalize_simplex_uniform_fallback_and_identity_on_simplex():
    x = torch.randn(50, 6, generator=gen(41), dtype=F64)
    x[3] = -x[3].abs()  # all non-positive
    x[7] = 0.0  # all zero
    x[9] = torch.tensor([-1.0, 0.0, -2.0, -0.5, 0.0, -3.0], dtype=F64)
    out = relu_normalize(x)
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(dim=-1).numpy(), 1.0, rtol=1e-12)
    for i in (3, 7, 9):
        assert torch.equal(out[i], torch.full((6,), 1.0 / 6, dtype=F64))
    r = np.maximum(x.numpy(), 0.0)
    ok = r.sum(axis=1) > 0
    np.testing.assert_allclose(out.numpy()[ok], r[ok] / r[ok].sum(axis=1, keepdims=True),
                               rtol=1e-12)
    # Identity on the simplex.
    alpha = torch.softmax(torch.randn(20, 6, generator=gen(42), dtype=F64), dim=-1)
    torch.testing.assert_close(relu_normalize(alpha), alpha, rtol=1e-14, atol=0)
    vertex = torch.tensor([[0.0, 1.0, 0.0]], dtype=F64)
    assert torch.equal(relu_normalize(vertex), vertex)


def test_relu_normalize_gradients_are_finite_and_correct():
    x = torch.tensor([[0.5, -1.0, 2.0, 0.3],
                      [-1.0, -0.5, -2.0, -0.1],  # falls back to uniform
                      [0.0, 0.0, 0.0, 0.0]], dtype=F64, requires_grad=True)
    w = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=F64)
    (relu_normalize(x) * w).sum().backward()
    grad = x.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert torch.equal(grad[1:], torch.zeros(2, 4, dtype=F64))  # no gradient through 1/B
    # Row 0: f = Σ w_j r_j / S  ⇒  ∂f/∂x_i = (w_i − Σ_j w_j α_j)/S for x_i > 0, 0 otherwise.
    x0 = x.detach()[0]
    r = x0.clamp_min(0)
    s = r.sum()
    expected = torch.where(x0 > 0, (w - (w * r / s).sum()) / s, torch.zeros_like(x0))
    torch.testing.assert_close(grad[0], expected, rtol=1e-12, atol=1e-15)


# --- VDP (§3.2.1) ------------------------------------------------------------------------------

def _vdp_inputs() -> torch.Tensor:
    x = torch.randn(40, 5, generator=gen(50), dtype=F64)
    return x * torch.logspace(-3, 1, 40, dtype=F64)[:, None]


@pytest.mark.parametrize("mechanism,delta,ord", [("laplace", 0.0, 1), ("gaussian", 1e-5, 2)])
def test_vdp_with_infinite_epsilon_returns_the_clipped_input(mechanism, delta, ord):
    theta = 0.5
    x = _vdp_inputs()
    out, event = _vdp_release(x, clip=theta, epsilon=math.inf, delta=delta, mechanism=mechanism,
                             generator=gen(51))
    norms = np.linalg.norm(x.numpy(), ord=ord, axis=1)
    inside = torch.from_numpy(norms <= theta * (1 - CLIP_MARGIN))
    assert inside.any() and (~inside).any()
    assert torch.equal(out[inside], x[inside])  # unchanged inside the ball
    expected = x.numpy() * np.minimum(1.0, theta * (1 - CLIP_MARGIN) / norms)[:, None]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    assert not event.is_private and event.phase == "serve"


def test_vdp_laplace_clips_l1_and_adds_scale_two_theta_over_epsilon():
    theta, eps = 0.3, 0.8
    x = torch.randn(40_000, 5, generator=gen(52), dtype=F64) * 3  # almost all outside
    out, event = _vdp_release(x, clip=theta, epsilon=eps, generator=gen(53))
    l1 = x.abs().sum(dim=1, keepdim=True)
    clipped = x * torch.clamp(theta / l1, max=1.0)
    noise = (out - clipped).numpy().ravel()
    b = 2 * theta / eps
    assert event.noise_scale == pytest.approx(b, rel=1e-12)
    assert event.sensitivity == pytest.approx(2 * theta) and event.epsilon == eps
    assert event.dimension == 5 and event.mechanism == "laplace"
    assert abs(np.abs(noise).mean() - b) < 5 * b / math.sqrt(noise.size)
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue > 1e-3
    # Power: the noise is NOT centred on the unclipped input.
    assert stats.kstest((out - x).numpy().ravel(), stats.laplace(scale=b).cdf).pvalue < 1e-6


def test_vdp_gaussian_clips_l2_and_uses_analytic_sigma():
    theta, eps, delta = 0.3, 2.0, 1e-6
    x = torch.randn(40_000, 5, generator=gen(54), dtype=F64) * 3
    out, event = _vdp_release(x, clip=theta, epsilon=eps, delta=delta, mechanism="gaussian",
                             generator=gen(55))
    l2 = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    noise = (out - x * torch.clamp(theta / l2, max=1.0)).numpy().ravel()
    sigma = gaussian_sigma(epsilon=eps, delta=delta, sensitivity_l2=2 * theta)
    assert event.noise_scale == pytest.approx(sigma, rel=1e-9)
    assert event.sensitivity == pytest.approx(2 * theta) and event.delta == delta
    assert abs(noise.std() - sigma) < 5 * sigma / math.sqrt(2 * noise.size)
    assert stats.kstest(noise, stats.norm(scale=sigma).cdf).pvalue > 1e-3


def test_vdp_validation():
    x = torch.ones(2, 3)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ConfigError, match="'clip'"):
            _vdp_release(x, clip=bad, epsilon=1.0, generator=gen(0))
    with pytest.raises(ConfigError, match="'delta'"):
        _vdp_release(x, clip=1.0, epsilon=1.0, delta=1e-5, generator=gen(0))
    with pytest.raises(ConfigError, match="mechanism"):
        _vdp_release(x, clip=1.0, epsilon=1.0, mechanism="uniform", generator=gen(0))


def test_permute_columns_swaps_the_chosen_column_into_column_zero():
    n, k1 = 200, 5
    cand = torch.arange(n * k1).reshape(n, k1)
    before = cand.clone()
    chosen = torch.randint(0, k1, (n,), generator=gen(63))
    assert (chosen == 0).any() and (chosen > 0).any()
    out = permute_columns(cand, chosen)
    assert torch.equal(cand, before)
    for i in range(n):
        c = int(chosen[i])
        expected = cand[i].clone()
        expected[0], expected[c] = cand[i, c], cand[i, 0]
        assert torch.equal(out[i], expected)
    assert torch.equal(out.sort(dim=1).values, cand.sort(dim=1).values)


# --- empirical audits --------------------------------------------------------------------------

ALPHA = 0.05
R0 = 0.0  # public value of the anonymous news r₀
# Toy user model: α = softmax(bias + slope·mean(history)) with B = 3. History D = [0, 0, 0, 0]
# gives logits [20, 0, -20] (α ≈ e₁); D′ = [1, 0, 0, 0] gives [-20, 40, -20] (α′ ≈ e₂), so
# ‖α − α′‖₁ ≈ 2 = the true L1 sensitivity, and padding D′'s first item yields α(D): the
# worst case for amplification by padding (docs/privacy.md#padding-amplification is then tight).
BIAS = torch.tensor([20.0, 0.0, -20.0], dtype=F64)
SLOPE = torch.tensor([-160.0, 160.0, 0.0], dtype=F64)
HIST_D = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=F64)
HIST_D_PRIME = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)


def toy_alpha(history: torch.Tensor) -> torch.Tensor:
    """[n, H] -> [n, 3] on the simplex."""
    return torch.softmax(BIAS + history.mean(dim=-1, keepdim=True) * SLOPE, dim=-1)


def dpa_release(*, epsilon: float, padding_p: float, pad: bool = True,
                sensitivity: str = "true"):
    def mechanism(histories: torch.Tensor, source: NoiseSource) -> torch.Tensor:
        mask = torch.ones(histories.shape, dtype=torch.bool)
        if pad:
            padded = padding_mask(mask, padding_p=padding_p, noise=source)
            histories = torch.where(padded, torch.full_like(histories, R0), histories)
        alpha = toy_alpha(histories)
        noise, _ = _dpa_noise(tuple(alpha.shape), epsilon=epsilon, padding_p=padding_p,
                             sensitivity=sensitivity, generator=source, dtype=F64)
        return alpha + noise
    return mechanism


def laplace_log_ratio(y: torch.Tensor) -> torch.Tensor:
    """b·ln(p_{D′}(y)/p_D(y)) for Laplace noise around e₁ (D) and e₂ (D′), in [−2, 2].

    Rounded to 1e-6: unrounded, the last-bit rounding errors of the arithmetic differ
    between D (α₁ = 1 − 2e-9) and D′ and the threshold search exploits them (a
    floating-point side channel of this statistic, not the textbook mechanism).
    """
    y1, y2 = y[:, 0], y[:, 1]
    return torch.round((y1 - 1).abs() - y1.abs() + y2.abs() - (y2 - 1).abs(), decimals=6)


def test_toy_user_model_is_a_worst_case_pair():
    a, a_prime = toy_alpha(HIST_D[None]), toy_alpha(HIST_D_PRIME[None])
    assert (a - a_prime).abs().sum().item() > 2 - 1e-6
    padded_prime = HIST_D_PRIME.clone()
    padded_prime[0] = R0
    assert torch.equal(toy_alpha(padded_prime[None]), a)


def test_audit_dpa_end_to_end_stays_below_the_claimed_epsilon():
    eps, p = 1.0, 0.5
    result = audit_mechanism(dpa_release(epsilon=eps, padding_p=p), HIST_D, HIST_D_PRIME,
                             trials=100_000, noise=sim(70), alpha=ALPHA,
                             statistic=laplace_log_ratio)
    assert result.epsilon_lower_bound <= eps
    # The audit is nearly tight here (it is not vacuous): ε = 1 is the exact privacy loss.
    assert result.epsilon_lower_bound > 0.8


@pytest.mark.parametrize("variant", ["no_padding", "paper_sensitivity", "noise_too_small"])
def test_audit_dpa_broken_variants_exceed_the_claimed_epsilon(variant):
    eps, p = 1.0, 0.5
    if variant == "no_padding":  # noise at ε′ but the history is never padded: true ε = ε′
        mech = dpa_release(epsilon=eps, padding_p=p, pad=False)
    elif variant == "paper_sensitivity":  # S = θ = 1 (docs/privacy.md#dpa-sensitivity): true ε ≈ 2.34
        mech = dpa_release(epsilon=eps, padding_p=p, sensitivity="paper")
    else:  # noise 10x too small, claiming ε = 1
        def mech(histories, source):
            y = dpa_release(epsilon=math.inf, padding_p=p)(histories, source)
            noise, _ = _dpa_noise((histories.shape[0], 3), epsilon=eps, padding_p=p,
                                 generator=source, dtype=F64)
            return y + noise / 10
    result = audit_mechanism(mech, HIST_D, HIST_D_PRIME, trials=100_000, noise=sim(71),
                             alpha=ALPHA, statistic=laplace_log_ratio)
    assert result.epsilon_lower_bound > eps


def vdp_mechanism(*, eps: float, theta: float, clip: bool = True, delta: float = 0.0,
                  mechanism: str = "laplace"):
    def mech(batch: torch.Tensor, source: NoiseSource) -> torch.Tensor:
        if clip:
            return _vdp_release(batch, clip=theta, epsilon=eps, delta=delta,
                               mechanism=mechanism, generator=source)[0]
        # Broken: noise calibrated to Δ = 2θ but the input is never clipped.
        released, _ = _vdp_release(torch.zeros_like(batch), clip=theta, epsilon=eps,
                                  delta=delta, mechanism=mechanism, generator=source)
        return batch + released
    return mech


def test_audit_vdp_laplace_below_epsilon_and_unclipped_variant_exceeds():
    eps, theta = 1.0, 0.5
    # Opposite ends of the ball after clipping: the inputs lie far outside it.
    x = torch.tensor([3.0, 0.0], dtype=F64)
    xp = torch.tensor([-3.0, 0.0], dtype=F64)
    good = audit_mechanism(vdp_mechanism(eps=eps, theta=theta), x, xp, trials=100_000,
                           noise=sim(80), alpha=ALPHA)
    assert 0.8 < good.epsilon_lower_bound <= eps
    bad = audit_mechanism(vdp_mechanism(eps=eps, theta=theta, clip=False), x, xp,
                          trials=100_000, noise=sim(81), alpha=ALPHA)
    assert bad.epsilon_lower_bound > eps


def test_audit_vdp_gaussian_below_epsilon_and_small_noise_variant_exceeds():
    eps, theta, delta = 1.0, 0.5, 1e-5
    x = torch.tensor([0.0, 2.0, 0.0], dtype=F64)
    xp = torch.tensor([0.0, -2.0, 0.0], dtype=F64)
    good = audit_mechanism(vdp_mechanism(eps=eps, theta=theta, delta=delta,
                                         mechanism="gaussian"), x, xp, trials=100_000,
                           noise=sim(82), alpha=ALPHA, delta=delta)
    assert 0.2 < good.epsilon_lower_bound <= eps
    sigma = gaussian_sigma(epsilon=eps, delta=delta, sensitivity_l2=2 * theta) / 10

    def broken(batch, noise):  # L2 clip, noise 10x too small
        l2 = torch.linalg.vector_norm(batch, dim=-1, keepdim=True)
        clipped = batch * torch.clamp(theta / l2, max=1.0)
        return clipped + noise.draw(batch.shape, mechanism="gaussian", scale=sigma, dtype=F64)

    bad = audit_mechanism(broken, x, xp, trials=100_000, noise=sim(83), alpha=ALPHA,
                          delta=delta)
    assert bad.epsilon_lower_bound > eps


def test_simplex_project_is_the_euclidean_projection_onto_the_simplex():
    from privaterec.privacy.dpa import simplex_project

    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 5, generator=g, dtype=torch.float64) * 2
    p = simplex_project(x)
    assert bool((p >= 0).all())
    torch.testing.assert_close(p.sum(-1), torch.ones(200, dtype=torch.float64))
    # Optimal: no point of the simplex is closer to x (random candidates, and the vertices).
    candidates = torch.distributions.Dirichlet(torch.ones(5, dtype=torch.float64)).sample((500,))
    candidates = torch.cat([candidates, torch.eye(5, dtype=torch.float64)])
    best = torch.cdist(x, candidates).min(dim=1).values
    assert bool((torch.linalg.vector_norm(x - p, dim=-1) <= best + 1e-12).all())
    # A point already on the simplex is its own projection; a shift by c·1 changes nothing.
    on = torch.softmax(x, dim=-1)
    torch.testing.assert_close(simplex_project(on), on, rtol=0, atol=1e-15)
    torch.testing.assert_close(simplex_project(x + 7.0), p, rtol=0, atol=1e-12)
    # Unlike softplus, it keeps no floor: small coordinates go to exactly 0.
    assert simplex_project(torch.tensor([2.0, 0.0, -1.0])).tolist() == [1.0, 0.0, 0.0]
