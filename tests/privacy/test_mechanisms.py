"""Tests of privaterec.privacy.mechanisms: noise distributions, clipping, mechanisms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from scipy import stats

from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import calibrate, clipped_release, no_noise
from privaterec.privacy.mechanisms import (
    CLIP_MARGIN,
    add_noise,
    apply_clip,
    calibrated_noise,
    clip_and_noise,
    clip_elementwise,
    clip_l1,
    clip_l2,
    randomized_response,
)
from privaterec.privacy.samplers import SimulationNoise

N = 200_000


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sim(seed: int = 0) -> SimulationNoise:
    return SimulationNoise(gen(seed))


# --- noise distributions -----------------------------------------------------------------------

def test_laplace_noise_moments_and_ks():
    b = 2.0
    x = sim(1).draw((N,), mechanism="laplace", scale=b, dtype=torch.float64).numpy()
    # |X| ~ Exp(b): mean b, sd b -> standard error b/sqrt(N); 5 standard errors.
    assert abs(np.abs(x).mean() - b) < 5 * b / math.sqrt(N)
    # Var X = 2b²; Var(X²) = E X⁴ − (E X²)² = 24b⁴ − 4b⁴ = 20b⁴.
    assert abs(x.var() - 2 * b**2) < 5 * math.sqrt(20) * b**2 / math.sqrt(N)
    assert abs(x.mean()) < 5 * math.sqrt(2) * b / math.sqrt(N)
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3
    # A wrong scale is detected by the same test (the KS check has power).
    assert stats.kstest(x, stats.laplace(scale=1.1 * b).cdf).pvalue < 1e-6


def test_gaussian_noise_std_and_ks():
    sigma = 0.7
    x = sim(2).draw((N,), mechanism="gaussian", scale=sigma, dtype=torch.float64).numpy()
    assert abs(x.std() - sigma) < 5 * sigma / math.sqrt(2 * N)
    assert abs(x.mean()) < 5 * sigma / math.sqrt(N)
    assert stats.kstest(x, stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert stats.kstest(x, stats.norm(scale=1.05 * sigma).cdf).pvalue < 1e-6


def test_noise_dtype_shape_zero_scale_and_per_row_scale():
    x = sim().draw((3, 4), mechanism="laplace", scale=1.0, dtype=torch.float32)
    assert x.shape == (3, 4) and x.dtype == torch.float32
    assert torch.equal(sim().draw((5,), mechanism="laplace", scale=0.0), torch.zeros(5))
    assert torch.equal(sim().draw((5,), mechanism="gaussian", scale=0.0), torch.zeros(5))
    # Per-client scales broadcast along rows.
    scales = torch.tensor([[0.5], [4.0]])
    y = sim(3).draw((2, 100_000), mechanism="laplace", scale=scales, dtype=torch.float64)
    assert y[0].abs().mean().item() == pytest.approx(0.5, rel=0.02)
    assert y[1].abs().mean().item() == pytest.approx(4.0, rel=0.02)
    z = sim(4).draw((2, 100_000), mechanism="gaussian", scale=scales, dtype=torch.float64)
    assert z[1].std().item() == pytest.approx(4.0, rel=0.02)
    with pytest.raises(ConfigError, match="'scale'"):
        sim().draw((2,), mechanism="laplace", scale=-1.0)
    with pytest.raises(ConfigError, match="'sigma'"):
        sim().draw((2,), mechanism="gaussian", scale=math.inf, name="sigma")


def test_laplace_noise_is_finite_and_has_the_right_tail():
    x = sim(5).draw((1_000_000,), mechanism="laplace", scale=1.0, dtype=torch.float32)
    assert torch.isfinite(x).all()
    # P(|X| > 10) = e^-10: the count is Binomial(1e6, e^-10) (mean 45.4); 5 standard deviations.
    p = math.exp(-10)
    count = (x.abs() > 10).sum().item()
    assert abs(count - 1e6 * p) < 5 * math.sqrt(1e6 * p * (1 - p))


def test_generator_determinism_and_global_rng_untouched():
    state = torch.get_rng_state()
    a = sim(42).draw((1000,), mechanism="laplace", scale=1.0)
    b = sim(42).draw((1000,), mechanism="laplace", scale=1.0)
    c = sim(43).draw((1000,), mechanism="laplace", scale=1.0)
    g1 = sim(42).draw((1000,), mechanism="gaussian", scale=1.0)
    g2 = sim(42).draw((1000,), mechanism="gaussian", scale=1.0)
    calibration = calibrate(mechanism="laplace", epsilon=1.0, sensitivity=1.0)
    out1 = add_noise(torch.zeros(10), calibration, noise=sim(7))
    out2 = add_noise(torch.zeros(10), calibration, noise=sim(7))
    r1, _ = randomized_response(torch.zeros(50, dtype=torch.long), epsilon=0.5, num_classes=3,
                                noise=sim(8))
    r2, _ = randomized_response(torch.zeros(50, dtype=torch.long), epsilon=0.5, num_classes=3,
                                noise=sim(8))
    assert torch.equal(a, b) and torch.equal(g1, g2) and torch.equal(out1, out2)
    assert torch.equal(r1, r2)
    assert not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state)


# --- clipping -------------------------------------------------------------------------------

def _rows():
    x = torch.randn(64, 10, dtype=torch.float64, generator=gen(100)) * torch.logspace(-2, 2, 64,
                                                                   dtype=torch.float64)[:, None]
    x[5] = 0.0
    return x


@pytest.mark.parametrize("clip,ord", [(clip_l2, 2), (clip_l1, 1)])
def test_clip_norm_bounds_and_preserves_inside_rows(clip, ord):
    x = _rows()
    bound = 1.5
    y = clip(x, bound)
    norms_in = np.linalg.norm(x.numpy(), ord=ord, axis=1)
    norms_out = np.linalg.norm(y.numpy(), ord=ord, axis=1)
    assert (norms_out <= bound).all()
    inside = norms_in <= bound * (1 - CLIP_MARGIN)
    assert inside.any() and (~inside).any()
    assert torch.equal(y[torch.from_numpy(inside)], x[torch.from_numpy(inside)])
    # Rows outside keep their direction and land on the sphere of radius C·(1 − 2^−22).
    expected = x.numpy()[~inside] * (bound * (1 - CLIP_MARGIN) / norms_in[~inside])[:, None]
    np.testing.assert_allclose(y.numpy()[~inside], expected, rtol=1e-12)
    assert torch.equal(y[5], torch.zeros(10))


def test_clip_float32_norms_are_exactly_within_the_bound_and_zero_bound():
    x = _rows().float()
    y = clip_l2(x, 0.3)
    assert (torch.linalg.vector_norm(y.double(), dim=-1) <= 0.3).all()  # exact, no tolerance
    # Float32 rows whose norm is C to within float32 rounding, the cases a float32 norm
    # and factor could push above C: scaled, their exact norms stay ≤ C.
    for seed, d in [(1, 10), (2, 1000), (3, 91_200)]:
        rows = torch.randn(64, d, generator=gen(seed))
        rows = rows / torch.linalg.vector_norm(rows, dim=-1, keepdim=True) * 0.3
        rows = rows * (1 + torch.linspace(-3e-7, 3e-7, 64))[:, None]
        out = clip_l2(rows, 0.3)
        assert (torch.linalg.vector_norm(out.double(), dim=-1) <= 0.3).all(), d
    assert torch.equal(clip_l2(x, 0.0), torch.zeros_like(x))
    with pytest.raises(ConfigError, match="'bound'"):
        clip_l1(x, -1.0)
    with pytest.raises(ConfigError, match="float32 or float64"):
        clip_l2(x.to(torch.bfloat16), 0.3)  # the margin does not cover bfloat16 rounding


def test_clip_dim_none_clips_each_leading_item_over_all_dims():
    x = torch.randn(6, 3, 4, dtype=torch.float64, generator=gen(101)) * 5
    y = clip_l2(x, 2.0, dim=None)
    flat = y.reshape(6, -1)
    np.testing.assert_allclose(torch.linalg.vector_norm(flat, dim=-1).numpy(),
                               np.minimum(torch.linalg.vector_norm(x.reshape(6, -1),
                                                                   dim=-1).numpy(),
                                          2.0 * (1 - CLIP_MARGIN)),
                               rtol=1e-12)
    # Per-row (dim=-1) clipping differs from per-item clipping.
    assert not torch.allclose(clip_l2(x, 2.0, dim=-1), y)
    with pytest.raises(ConfigError, match="dim=None"):
        clip_l2(torch.ones(3), 1.0, dim=None)


def test_clip_per_client_tensor_bound_and_vmap():
    x = torch.randn(4, 8, generator=gen(102)) * 10
    bounds = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    y = clip_l2(x, bounds)
    np.testing.assert_allclose(torch.linalg.vector_norm(y, dim=-1).numpy(), [1, 2, 3, 4],
                               rtol=1e-5)
    v = torch.func.vmap(lambda row: clip_l2(row, 1.0))(x)
    torch.testing.assert_close(v, clip_l2(x, 1.0))
    v1 = torch.func.vmap(lambda row: clip_l1(row, 1.0))(x)
    torch.testing.assert_close(v1, clip_l1(x, 1.0))


def test_clip_elementwise():
    x = torch.tensor([[-3.0, -0.5, 0.0, 0.2, 9.0]])
    assert torch.equal(clip_elementwise(x, 1.0), torch.tensor([[-1.0, -0.5, 0.0, 0.2, 1.0]]))
    b = torch.tensor([[0.1, 1.0, 1.0, 0.1, 5.0]])
    assert torch.equal(clip_elementwise(x, b), torch.tensor([[-0.1, -0.5, 0.0, 0.1, 5.0]]))


# --- mechanisms -------------------------------------------------------------------------------

def test_laplace_mechanism_noise_and_event_batched():
    x = torch.full((4, 50_000), 3.0, dtype=torch.float64)
    calibration = calibrate(mechanism="laplace", epsilon=0.5, sensitivity=2.0,
                            dimension=50_000, phase="serve")
    out, event = add_noise(x, calibration, noise=sim(9)), calibration.event
    assert calibration.scale == 4.0 and calibration.mechanism == "laplace"
    noise = (out - x).numpy().ravel()
    assert stats.kstest(noise, stats.laplace(scale=4.0).cdf).pvalue > 1e-3
    assert out.dtype == torch.float64
    assert event.mechanism == "laplace" and event.phase == "serve"
    assert event.epsilon == 0.5 and event.delta == 0.0
    assert event.noise_scale == 4.0 and event.sensitivity == 2.0
    assert event.dimension == 50_000  # one client's release (row), not the batch
    assert event.to_dp_event() == dp_event.LaplaceDpEvent(noise_multiplier=2.0)
    # one generator per row: row i's noise is what generator i alone draws
    rows = add_noise(torch.zeros(3, 5), calibration, noise=SimulationNoise([gen(1), gen(2),
                                                                            gen(3)]))
    alone = add_noise(torch.zeros(1, 5), calibration, noise=SimulationNoise([gen(2)]))
    assert torch.equal(rows[1], alone[0])
    with pytest.raises(ConfigError, match="one generator per row"):
        add_noise(torch.zeros(3, 5), calibration, noise=SimulationNoise([gen(1), gen(2)]))
    with pytest.raises(ConfigError, match="'delta'"):
        calibrate(mechanism="laplace", epsilon=1.0, delta=1e-5, sensitivity=1.0)
    with pytest.raises(ConfigError, match="mechanism"):
        calibrate(mechanism="uniform", epsilon=1.0, sensitivity=1.0)  # type: ignore[arg-type]


def test_laplace_mechanism_with_padding_uses_base_budget():
    eps, p = 1.0, 0.5
    eps_base = math.log((math.exp(eps) - p) / (1 - p))  # PrivateRec Alg. 2 line 9
    calibration = calibrate(mechanism="laplace", epsilon=eps, sensitivity=2.0, padding_p=p)
    out = add_noise(torch.zeros(100_000, dtype=torch.float64), calibration, noise=sim(10))
    event = calibration.event
    assert event.noise_scale == pytest.approx(2.0 / eps_base, rel=1e-12)
    assert event.epsilon == eps and event.padding_p == p
    assert out.abs().mean().item() == pytest.approx(2.0 / eps_base, rel=0.02)
    # The amplified guarantee is pure ε: accounted as binary randomized response with ε.
    dp = event.to_dp_event()
    assert isinstance(dp, dp_event.RandomizedResponseDpEvent)
    assert dp.noise_parameter == pytest.approx(2 / (1 + math.e))
    # user level (a whole history replaced): the base budget the noise was calibrated to
    assert calibration.user_epsilon == pytest.approx(eps_base, rel=1e-12)


def test_mechanisms_with_infinite_epsilon_add_no_noise():
    x = torch.randn(3, 4, generator=gen(11))
    laplace = calibrate(mechanism="laplace", epsilon=math.inf, sensitivity=1.0)
    event = laplace.event
    assert torch.equal(add_noise(x, laplace, noise=sim()), x) and not event.is_private
    assert laplace.scale == 0.0
    assert isinstance(event.to_dp_event(), dp_event.NonPrivateDpEvent)
    gaussian = calibrate(mechanism="gaussian", epsilon=math.inf, delta=1e-5, sensitivity=1.0)
    out = add_noise(x, gaussian, noise=sim())
    assert torch.equal(out, x) and not gaussian.event.is_private
    clear = no_noise(dimension=4)
    assert add_noise(x, clear, noise=sim()) is x and clear.mechanism == "none"
    assert torch.equal(calibrated_noise((2, 2), clear, noise=sim()), torch.zeros(2, 2))


def test_gaussian_mechanism_noise_and_event():
    x = torch.zeros(8, 25_000, dtype=torch.float64)
    calibration = calibrate(mechanism="gaussian", epsilon=1.0, delta=1e-5,
                            sensitivity=math.sqrt(2), dimension=25_000)
    out, event = add_noise(x, calibration, noise=sim(12)), calibration.event
    sigma = math.sqrt(2) * 3.7306316348  # analytic σ(1, 1e-5), see test_formulas
    assert event.noise_scale == pytest.approx(sigma, rel=1e-9)
    assert stats.kstest(out.numpy().ravel(), stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert event.dimension == 25_000 and event.delta == 1e-5
    assert event.to_dp_event() == dp_event.GaussianDpEvent(
        noise_multiplier=pytest.approx(3.7306316348, rel=1e-9))
    padded = calibrate(mechanism="gaussian", epsilon=1.0, delta=1e-5, sensitivity=1.0,
                       padding_p=0.2).event
    assert padded.noise_scale < 3.7306316348  # amplification allows less noise
    assert type(padded.to_dp_event()).__name__ == "EpsilonDeltaDpEvent"


@pytest.mark.parametrize("clipping,ord", [("l1", 1), ("l2", 2), ("elementwise", math.inf)])
def test_clipped_release_clips_to_its_sensitivity_then_noises(clipping, ord):
    theta, d = 0.5, 40
    x = torch.randn(6, d, generator=gen(14), dtype=torch.float64)
    calibration = clipped_release(clipping=clipping, clip=theta, dimension=d, epsilon=2.0,
                                  delta=1e-5 if clipping == "l2" else 0.0)
    clipped = apply_clip(x, calibration)
    norms = torch.linalg.vector_norm(clipped, ord=ord, dim=1)
    assert bool((norms <= theta * (1 + 1e-9)).all()) and norms.max() > 0.99 * theta
    # Replacement: two clipped rows differ by at most 2θ (2θD coordinate-wise clip in L1).
    sensitivity = 2 * theta * (d if clipping == "elementwise" else 1)
    assert calibration.event.sensitivity == pytest.approx(sensitivity)
    assert calibration.mechanism == ("gaussian" if clipping == "l2" else "laplace")
    released = clip_and_noise(x, calibration, noise=sim(15))
    assert torch.equal(released, add_noise(clipped, calibration, noise=sim(15)))
    assert not torch.equal(released, clipped)


def test_clipped_release_at_a_given_scale_states_its_epsilon():
    calibration = clipped_release(clipping="elementwise", clip=0.005, dimension=100,
                                  noise_scale=0.015)
    assert calibration.epsilon == pytest.approx(2 * 0.005 * 100 / 0.015, rel=1e-12)
    assert calibration.event.coordinate_epsilon == pytest.approx(2 * 0.005 / 0.015, rel=1e-12)
    assert calibration.scale == 0.015
    silent = clipped_release(clipping="l1", clip=0.1, dimension=10, noise_scale=0.0)
    assert not silent.event.is_private and silent.scale == 0.0
    with pytest.raises(ConfigError, match="exactly one"):
        clipped_release(clipping="l1", clip=0.1, dimension=10, epsilon=1.0, noise_scale=0.1)
    with pytest.raises(ConfigError, match="'clip'"):
        clipped_release(clipping="l1", clip=0.0, dimension=10, epsilon=1.0)


def test_randomized_response_keep_rate_and_uniform_flips():
    k, eps = 4, 1.0
    labels = torch.arange(N, dtype=torch.long) % k
    out, event = randomized_response(labels, epsilon=eps, num_classes=k, noise=sim(13))
    keep = (out == labels).double().mean().item()
    p_keep = math.exp(eps) / (math.exp(eps) + k - 1)
    assert abs(keep - p_keep) < 5 * math.sqrt(p_keep * (1 - p_keep) / N)
    flipped = out[(out != labels) & (labels == 0)]
    counts = torch.bincount(flipped, minlength=k)[1:].numpy()
    assert stats.chisquare(counts).pvalue > 1e-3  # uniform over the k − 1 other labels
    assert event.epsilon == eps and event.mechanism == "randomized_response"
    same, _ = randomized_response(labels[:10], epsilon=math.inf, num_classes=k, noise=sim())
    assert torch.equal(same, labels[:10])
    with pytest.raises(ConfigError, match="num_classes"):
        randomized_response(labels, epsilon=1.0, num_classes=3, noise=sim())


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_one_generator_per_row_draws_each_row_from_its_own_generator(noise):
    def draw(shape, generator):
        return SimulationNoise(generator).draw(shape, mechanism=noise, scale=0.5)

    rows = draw((3, 7), [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    alone = torch.stack([draw((7,), torch.Generator().manual_seed(s)) for s in (1, 2, 3)])
    assert torch.equal(rows, alone)
    with pytest.raises(ConfigError, match="one generator per row"):
        draw((2, 7), [torch.Generator()])


def test_mechanisms_and_calibrations_do_not_import_the_accountant():
    """The event lives in privacy/events.py: the mechanisms, the calibrations and the
    release functions load without the ledger (the accountant) or anything above privacy/."""
    import subprocess
    import sys

    modules = ["mechanisms", "calibrate", "dpa", "labels", "samplers", "central_accounting"]
    code = ("import sys\n" + "".join(f"import privaterec.privacy.{m}\n" for m in modules)
            + "print(sorted(k for k in sys.modules if k.startswith('privaterec.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    assert "privaterec.privacy.events" in loaded
    assert "privaterec.privacy.ledger" not in loaded
    for above in ("privaterec.fed", "privaterec.models", "privaterec.recall"):
        assert above not in loaded
