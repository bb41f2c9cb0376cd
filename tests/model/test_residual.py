"""Seed 003 residual-addition variants (muonlab.model.variants.residual_rules, radius_gate), seed 003 Tables 1–2 and "What the combined evidence supports" item 1.

References are independent of the module: an explicit d x d float64 projector, and a per-position
loop with a two-pass variance for z."""

import itertools
import math

import pytest
import torch

from muonlab.model.variants.radius_gate import RADIUS_GATES, prefix_log_rms_z, radius_gate_scale
from muonlab.model.variants.residual_rules import RESIDUAL_RULES, residual_add


def _pair(dtype=torch.float32, shape=(2, 5, 16), seed=0, zero_token=True):
    gen = torch.Generator().manual_seed(seed)
    u, f, gy = (torch.randn(shape, generator=gen) for _ in range(3))
    if zero_token:
        u[0, 1] = -f[0, 1]  # y = u + f is exactly 0 at this token: exercises the 1e-20 floor
    return u.to(dtype).requires_grad_(), f.to(dtype).requires_grad_(), gy.to(dtype)


def _grads(u, f, gy, rule):
    return torch.autograd.grad(residual_add(u, f, rule), (u, f), gy)


def _ref_project(y, g):
    """P_y g with P_y = I - y y^T / max(|y|^2, 1e-20) materialised per token, float64."""
    y, g = y.detach().double(), g.double()
    n2 = y.square().sum(-1).clamp_min(1e-20)[..., None, None]
    proj = torch.eye(y.shape[-1], dtype=torch.float64) - torch.einsum("...i,...j->...ij", y, y) / n2
    return torch.einsum("...ij,...j->...i", proj, g)


# fp32 vs float64: inputs are O(1) with d = 16, so each output carries a few fp32 roundings
# (~6e-8 relative) of O(1..10) terms; observed max error 1.4e-7, 1e-6 leaves a 7x margin.
FP32_TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rule", RESIDUAL_RULES)
def test_forward_is_bitwise_u_plus_f(rule, dtype):
    u, f, _ = _pair(dtype)
    y = residual_add(u, f, rule)
    assert y.dtype == dtype and torch.equal(y, u + f)
    assert (y.grad_fn.name() == "AddBackward0") == (rule == "ordinary")  # ordinary: plain autograd


def test_unknown_rule_raises():
    with pytest.raises(ValueError, match="residual rule"):
        residual_add(*_pair()[:2], "tangent")


@pytest.mark.parametrize("rule", RESIDUAL_RULES[1:])  # the custom Functions
def test_custom_rules_save_only_y(rule):
    u, f, _ = _pair()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = residual_add(u, f, rule)
    assert len(saved) == 1 and torch.equal(saved[0], y)


def test_branch_tangent_matches_projector_fp32():
    u, f, gy = _pair()
    gu, gf = _grads(u, f, gy, "branch_tangent")
    assert torch.equal(gu, gy)  # skip credit untouched
    ref = _ref_project(u + f, gy)
    torch.testing.assert_close(gf.double(), ref, **FP32_TOL)
    assert torch.isfinite(gf).all() and torch.equal(gf[0, 1], gy[0, 1])  # y = 0: P = I, no NaN


def test_branch_tangent_bf16_computed_in_fp32_then_cast():
    u, f, gy = _pair(torch.bfloat16, shape=(4, 8, 64))
    gu, gf = _grads(u, f, gy, "branch_tangent")
    assert gu.dtype == gf.dtype == torch.bfloat16 and torch.equal(gu, gy)
    ref = _ref_project(u + f, gy)
    # one bf16 rounding of an fp32-accurate value: |err| <= 2^-9 |ref| (+ fp32 noise near 0), and
    # nearly every element is the correctly rounded value; bf16 accumulation fails both where g cancels
    torch.testing.assert_close(gf.double(), ref, rtol=2 ** -8, atol=1e-5)
    assert (gf == ref.to(torch.bfloat16)).double().mean() > 0.99


def test_projection_is_orthogonal_to_y():
    u, f, gy = _pair(shape=(3, 7, 128), zero_token=False)
    _, gf = _grads(u, f, gy, "branch_tangent")
    y = (u + f).detach().double()
    dots = (gf.double() * y).sum(-1).abs()
    # fp32 rounding of the d = 128 terms bounds the residual inner product by ~d eps |y||g|
    bound = 128 * 2 ** -24 * y.norm(dim=-1) * gy.double().norm(dim=-1)
    assert (dots <= bound).all()
    assert ((gy.double() * y).sum(-1).abs() > 10 * bound).any()  # the test would notice no projection


def test_whole_state_tangent_projects_both():
    u, f, gy = _pair()
    for grad in _grads(u, f, gy, "whole_state_tangent"):
        torch.testing.assert_close(grad.double(), _ref_project(u + f, gy), **FP32_TOL)


def test_grad_mag_control_magnitude_of_projection_direction_of_gy():
    u, f, gy = _pair()
    gy[1, 2] = 0.0  # zero cotangent: the max(|g|, 1e-20) floor must give 0, not NaN
    gu, gf = _grads(u, f, gy, "grad_mag_control")
    assert torch.equal(gu, gy) and torch.isfinite(gf).all()
    g64, proj_norm = gy.double(), _ref_project(u + f, gy).norm(dim=-1)
    torch.testing.assert_close(gf.double().norm(dim=-1), proj_norm, **FP32_TOL)
    cos = torch.nn.functional.cosine_similarity(gf.double(), g64, dim=-1)
    live = g64.norm(dim=-1) > 0
    torch.testing.assert_close(cos[live], torch.ones_like(cos[live]), rtol=0, atol=1e-6)
    assert torch.equal(gf[1, 2], torch.zeros_like(gf[1, 2]))
    torch.testing.assert_close(gf[0, 1], gy[0, 1], rtol=1e-6, atol=0)  # y = 0: |P g| = |g|
    assert (proj_norm < 0.99 * g64.norm(dim=-1))[live].any()  # scaling really differs from 1


def _v(dtype=torch.float64, shape=(2, 24, 32), seed=1, scale=10.0):
    """Token RMS spread over ~e^{+-1.5} around `scale`, so log RMS varies and eps = 1e-6 is negligible."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    return (scale * x * torch.exp(0.5 * torch.randn(shape[:-1] + (1,), generator=gen, dtype=torch.float64))).to(dtype)


def _ref_z(v, eps=1e-6):
    v = v.detach().double()
    rho = 0.5 * torch.log(v.square().mean(-1) + eps)
    z = torch.empty_like(rho)
    for b, t in itertools.product(range(rho.shape[0]), range(rho.shape[1])):
        prefix = rho[b, : t + 1]
        mu = prefix.mean()
        z[b, t] = (rho[b, t] - mu) / math.sqrt(max((prefix - mu).square().mean().item(), 0.0) + eps)
    return z.unsqueeze(-1)


def test_z_matches_loop_float64_and_fp32():
    v = _v()
    z = prefix_log_rms_z(v)
    assert z.shape == (2, 24, 1) and z.dtype == torch.float64
    torch.testing.assert_close(z, _ref_z(v), rtol=0, atol=1e-12)  # same math, fp64 rounding only
    for scale in (10.0, 1e4):  # 1e4: |rho| ~ 9 >> its spread, where fp32 running sums cancel
        v32 = _v(torch.float32, scale=scale)
        z32 = prefix_log_rms_z(v32)
        assert z32.dtype == torch.float32  # fp32 statistics for fp32 (and bf16) inputs
        # fp32 log RMS carries ~1e-7 abs error, z divides by a prefix std of O(0.1..1): observed
        # <= 2e-6. Unshifted fp32 running sums give up to 2e-3 at scale 1e4 and fail here.
        torch.testing.assert_close(z32.double(), _ref_z(v32), rtol=0, atol=2e-5)


def test_z_first_position_is_zero_and_scale_invariant():
    v = _v(torch.float32)
    z = prefix_log_rms_z(v)
    assert torch.equal(z[:, 0], torch.zeros_like(z[:, 0]))
    for c in (0.25, 8.0, 1e3):
        # log RMS shifts by log c, standardisation removes it. eps/mean(v^2) <= 4e-6 here, so
        # eps moves rho by <= 2e-6; with fp32 rounding observed <= 1.5e-6, tolerance 2e-5.
        torch.testing.assert_close(prefix_log_rms_z(c * v), z, rtol=0, atol=2e-5)
    assert (z.abs() > 0.5).any()  # z is not trivially constant


def test_z_is_causal_and_rowwise():
    v = _v(torch.float32)
    z = prefix_log_rms_z(v)
    w = torch.cat([v[:, :10], 5.0 * v[:, 10:]], dim=1)  # change every position after t = 9 ...
    w[1, :, 3] += 1.0  # ... and all of row 1
    zw = prefix_log_rms_z(w)
    assert torch.equal(zw[0, :10], z[0, :10])  # prefix sums at t read only positions <= t
    assert not torch.allclose(zw[0, 10:], z[0, 10:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_zero_params_is_exactly_one_and_neutral_is_u_plus_f(dtype):
    u, f, _ = _pair(dtype)
    zero = torch.zeros((), requires_grad=True)
    for v in (u, f):  # state and branch inputs; "neutral" is either with a = b = 0 frozen
        g = radius_gate_scale(v, zero, zero)
        assert g.shape == (2, 5, 1) and g.dtype == dtype and torch.equal(g, torch.ones_like(g))
        assert torch.equal(u + g * f, u + f)  # so the neutral arm's forward is exactly ordinary
    assert RADIUS_GATES == ("none", "state", "branch", "neutral")


def test_gate_value_and_gradients():
    v = _v(torch.float32)
    g = radius_gate_scale(v, torch.tensor(0.3), torch.tensor(-0.7))
    torch.testing.assert_close(g.double(), torch.exp(0.3 - 0.7 * _ref_z(v)), rtol=1e-5, atol=0)
    torch.testing.assert_close(g[:, 0], torch.full_like(g[:, 0], math.exp(0.3)))  # z_0 = 0
    a64, b64 = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (0.3, -0.7))
    v64 = _v(shape=(2, 6, 4)).requires_grad_()  # float64, so gradcheck's finite differences are meaningful
    assert prefix_log_rms_z(v64).requires_grad  # ordinary autograd by default (seed 003): a path back into v
    assert not prefix_log_rms_z(v64, detach=True).requires_grad
    torch.autograd.gradcheck(lambda x: prefix_log_rms_z(x), (v64,))
    torch.autograd.gradcheck(lambda a_, b_: radius_gate_scale(v64, a_, b_), (a64, b64))
    u, f = (_v(shape=(2, 6, 4), seed=s).requires_grad_() for s in (2, 3))
    # state gate by default: the full derivative w.r.t. u (through z(u) as well as the identity path), f, a, b
    torch.autograd.gradcheck(lambda u_, f_, a_, b_: u_ + radius_gate_scale(u_, a_, b_) * f_, (u, f, a64, b64))
    # branch gate by default: the full derivative, including through z(f)
    torch.autograd.gradcheck(lambda u_, f_, a_, b_: u_ + radius_gate_scale(f_, a_, b_) * f_, (u, f, a64, b64))
    # branch gate with detached stats: f's gradient is g * g_y only, nothing through z
    gy = _v(shape=(2, 6, 4), seed=4)
    gate = radius_gate_scale(f, a64, b64, detach_stats=True)
    (gf,) = torch.autograd.grad(u + gate * f, f, gy)
    torch.testing.assert_close(gf, gate.detach() * gy, rtol=0, atol=0)
