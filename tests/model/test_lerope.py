"""LeRoPE (seed 000 Table 2, §4.2 item 2): baseline equivalence, reversible backward, memory."""

import math

import pytest
import torch

from muonlab.model.variants.lerope import (apply_lerope, inv_frequencies, lerope_angles,
                                  lerope_grad_agreement)
from muonlab.model.rotary import apply_rotary, rotary_tables

B, T, H, D = 2, 64, 3, 32
VARIANTS = {"shared": (D // 2,), "adapted": (H, D // 2)}


def _tau(shape, seed=0, scale=0.3, dtype=torch.float32):
    return (scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def _x(dtype, seed=1, shape=(B, T, H, D)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("shape", VARIANTS.values(), ids=VARIANTS.keys())
def test_tau_zero_bf16_trig_is_bitwise_baseline_rope(shape):
    # At init LeRoPE must not perturb the baseline at all: same fp32 angles, same bf16 rounding of
    # cos/sin, same bf16 products. Bitwise, because any difference would show up in step-0 losses.
    x = _x(torch.bfloat16)
    ref = apply_rotary(x, *rotary_tables(T, D))
    for reversible in (True, False):
        y = apply_lerope(x, torch.zeros(shape), inv_frequencies(D), torch.bfloat16, reversible)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, ref)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_tau_zero_fp32_trig_matches_fp32_tables(x_dtype):
    # Reference: fp32 tables built independently (outer product, no bf16 rounding), products in
    # fp32, one rounding to x.dtype at the end. Tolerance: fp32 rounding (a few ulp, rtol 2e-7 ~
    # 2^-22) for fp32 x; for bf16 x both sides round the same fp32 value, so half a bf16 ulp at most.
    x = _x(x_dtype)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x.float()[..., : D // 2], x.float()[..., D // 2:]
    ref = torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1).to(x_dtype)
    y = apply_lerope(x, torch.zeros(D // 2), inv_frequencies(D), torch.float32)
    assert y.dtype == x_dtype
    tol = dict(rtol=2e-7, atol=1e-6) if x_dtype == torch.float32 else dict(rtol=4e-3, atol=1e-5)
    torch.testing.assert_close(y, ref, **tol)


@pytest.mark.parametrize("name", VARIANTS)
def test_nonzero_tau_forward_matches_complex_rotation(name):
    # Independent float64 reference: y1 + i y2 = (x1 + i x2) * exp(-i phi), phi = t theta e^tau.
    # This pins the sign convention and the per-(head, channel) use of tau. float64 throughout,
    # so 1e-12 is just accumulated rounding of a handful of ops on O(1) values.
    tau = _tau(VARIANTS[name], dtype=torch.float64)
    x = _x(torch.float64)
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    theta = inv * tau.exp()
    phi = torch.arange(T, dtype=torch.float64).view(T, *([1] * theta.ndim)) * theta
    phi = phi[None, :, None] if name == "shared" else phi[None]
    z = torch.complex(x[..., : D // 2], x[..., D // 2:]) * torch.exp(-1j * phi)
    ref = torch.cat([z.real, z.imag], -1)
    torch.testing.assert_close(inv.float(), inv_frequencies(D), rtol=2e-7, atol=0)
    y = apply_lerope(x, tau, inv, torch.float64)  # fp64 frequencies: fp32 ones would cost ~1e-6
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("x_dtype,trig", [(torch.float32, torch.float32),
                                          (torch.bfloat16, torch.float32),
                                          (torch.bfloat16, torch.bfloat16),
                                          (torch.float32, torch.bfloat16)])
def test_reversible_forward_bitwise_equals_plain(name, x_dtype, trig):
    x, tau = _x(x_dtype), _tau(VARIANTS[name])
    y_rev = apply_lerope(x, tau, inv_frequencies(D), trig, reversible=True)
    y_plain = apply_lerope(x, tau, inv_frequencies(D), trig, reversible=False)
    assert torch.equal(y_rev, y_plain)


def _grads(x, tau, inv_freq, trig, g, reversible, calls=1):
    x = x.clone().requires_grad_()
    tau = tau.clone().requires_grad_()
    # calls=2 mimics the model: one tau rotates both q and k and autograd sums the two gradients.
    loss = sum((apply_lerope(x * (k + 1), tau, inv_freq, trig, reversible) * g).sum()
               for k in range(calls))
    loss.backward()
    return x.grad, tau.grad


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("calls", [1, 2])
def test_float64_gradients_match_plain_autograd(name, calls):
    # In float64 the analytic backward (from y only) and autograd (from x) are the same function up
    # to rounding at ~1e-16 relative; 1e-10 leaves room for the T-long tau reductions yet catches
    # any wrong sign or missing factor (those are O(1) errors).
    x, g = _x(torch.float64), _x(torch.float64, seed=2)
    tau, inv = _tau(VARIANTS[name], dtype=torch.float64), inv_frequencies(D).double()
    gx_c, gt_c = _grads(x, tau, inv, torch.float64, g, True, calls)
    gx_p, gt_p = _grads(x, tau, inv, torch.float64, g, False, calls)
    assert gt_c.shape == tau.shape and gt_c.dtype == torch.float64
    assert (gt_p.norm() > 0) and (gt_c - gt_p).norm() / gt_p.norm() < 1e-10
    assert (gx_c - gx_p).norm() / gx_p.norm() < 1e-10


@pytest.mark.parametrize("name,x_dtype,min_cos,max_rel", [
    # fp32 x, fp32 trig: both backwards are exact formulas in fp32; they differ only by rounding of
    # y vs x and summation order (measured ~1e-14 off cosine 1, rel L2 ~3e-7 at T=2048).
    ("shared", torch.float32, 0.9999, 1e-4),
    # bf16 x: the reversible path reads the bf16-rounded y (2^-9 relative per element) where autograd
    # reads x; adapted also differentiates analytically while autograd goes through the bf16-rounded
    # cos/sin tables. Paper: 0.9999978 / 0.9999841 at T=2048; measured rel L2 ~1e-3..5e-3.
    ("shared", torch.bfloat16, 0.999, 2e-2),
    ("adapted", torch.bfloat16, 0.999, 2e-2),
])
def test_low_precision_tau_gradient_agreement(name, x_dtype, min_cos, max_rel):
    r = lerope_grad_agreement(2, 256, 4, 64, name, seed=3, x_dtype=x_dtype)
    assert r["forward_max_abs_diff"] == 0.0
    assert r["tau_grad_cosine"] > min_cos
    assert r["tau_grad_rel_l2"] < max_rel
    assert r["x_grad_rel_l2"] < max_rel


def test_grad_agreement_runs_at_paper_length():
    # The paper's audit length, T=2048 on CPU (one sequence keeps it fast).
    for name in VARIANTS:
        r = lerope_grad_agreement(1, 2048, 4, 128, name, seed=0)
        assert r["forward_max_abs_diff"] == 0.0 and r["tau_grad_cosine"] > 0.999


def _saved_storages(x, tau, trig, reversible):
    ptrs = []

    def pack(t):
        ptrs.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = apply_lerope(x, tau, inv_frequencies(D), trig, reversible)
    y.sum().backward()  # the saved tensors must still be enough for the backward
    return ptrs


@pytest.mark.parametrize("name", VARIANTS)
def test_reversible_backward_does_not_save_x(name):
    x = _x(torch.bfloat16).requires_grad_()
    tau = _tau(VARIANTS[name]).requires_grad_()
    x_ptr, x_bytes = x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()
    plain = _saved_storages(x, tau, torch.bfloat16, reversible=False)
    assert (x_ptr, x_bytes) in plain  # the check can fail: plain autograd pins x (via x1/x2 views)
    rev = _saved_storages(x, tau, torch.bfloat16, reversible=True)
    assert all(ptr != x_ptr for ptr, _ in rev)
    # What it keeps instead: y (x-sized) and the fp32 phi table; nothing else of activation size.
    assert sorted(n for _, n in rev) == sorted([x_bytes, 4 * T * math.prod(VARIANTS[name])])


@pytest.mark.parametrize("name", VARIANTS)
def test_shapes(name):
    tau = torch.zeros(VARIANTS[name])
    phi = lerope_angles(T, inv_frequencies(D), tau)
    assert phi.dtype == torch.float32
    assert phi.shape == ((T, D // 2) if name == "shared" else (T, H, D // 2))
    x = _x(torch.bfloat16).requires_grad_()
    tau.requires_grad_()
    y = apply_lerope(x, tau, inv_frequencies(D), torch.bfloat16)
    y.float().square().sum().backward()
    assert y.shape == x.shape and y.dtype == x.dtype
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
    assert tau.grad.shape == tau.shape and tau.grad.dtype == torch.float32


def test_rejects_mismatched_tau():
    with pytest.raises(ValueError):
        apply_lerope(_x(torch.float32), torch.zeros(H + 1, D // 2), inv_frequencies(D), torch.float32)
    with pytest.raises(ValueError):
        apply_lerope(_x(torch.float32), torch.zeros(D), inv_frequencies(D), torch.float32)


@pytest.mark.parametrize("name", ["shared", "adapted"])
def test_gradcheck_float64(name):
    h = 3
    x = _x(torch.float64, shape=(2, 5, h, 8)).requires_grad_()
    tau = _tau((4,) if name == "shared" else (h, 4), dtype=torch.float64).requires_grad_()
    inv = inv_frequencies(8).double()
    assert torch.autograd.gradcheck(lambda a, b: apply_lerope(a, b, inv, torch.float64), (x, tau))
