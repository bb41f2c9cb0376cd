"""GPU acceptance tests (`pytest -m gpu`, run by `muonlab doctor --gpu`): every test here is marked
`gpu` and skipped without CUDA (tests/conftest.py).

(a) The CUDA attention backends, FlashAttention-3 (where it loads) and FlexAttention's sliding
    window (what `auto` falls back to), against an fp32 SDPA reference, forward and backward,
    bf16, GQA (8 query heads on 2 key/value heads), at the model's windows: full causal (the L
    layers' (T, 0)), half the context (the S layers of SSSL) and a short 128-token window, at
    T = 1024 and at T = 1000 (not a multiple of FlexAttention's 128-token block). The tolerance
    is the one flash-attention's own tests use: against the fp32 reference on the same bf16
    inputs, a backend's largest error is at most twice bf16 SDPA's, plus 1e-3 (output) or 1e-3
    of the largest reference gradient.
(b) Compiled against eager on CUDA: the baseline GPT and one arm for every registered method,
    arm group and model family (muonlab.doctor.selection.representative_arms), each at its
    family's smallest preset on CUDA in bf16, 4 steps (20 for the t5 family, whose losses move
    slower) of the real training loop on fixed learnable batches (tests/support/compile_check.py). The losses agree within 0.01 at the
    first step (the same weights: only kernels differ) and 0.03 after (bf16 rounding compounds
    through the updates; one step moves these losses by 0.2-0.7). On CPU (inductor's C++ code,
    bf16) the four steps of the baseline, 12do_disp_only_nomom, p003_branch_gate, k8_lookup and
    00_dense_native_lr141 agree within 0.0033.
(c) The clipped-row LMO of seed 004 (muonlab.optim.lmo) on CUDA, by both methods (sort, CUDA's
    default, and newton), against CPU's on the same tables, fp64 (rtol = atol = 1e-12) and fp32
    (rtol 1e-5, atol 1e-6): both are exact (the sorted closed form in fp64; a Newton iteration
    that lands on the root), so only the rounding of the row sums differs.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.compile_check import case_steps, train_losses

from muonlab.arms import resolve_config
from muonlab.doctor.selection import CUDA_OVERRIDES, representative_arms
from muonlab.errors import MuonlabError
from muonlab.model.attention import causal_attention, resolve_backend
from muonlab.optim.lmo import clipped_row_lmo, lmo_objective

pytestmark = pytest.mark.usefixtures("cuda")  # every test here is the gpu tier (support.tiers)
DEVICE = torch.device("cuda")

# ------------------------------------------------------------------------------ (a) FA3 vs SDPA
B, H, H_KV, D = 2, 8, 2, 128
# (T, left): the full, half and short windows at T = 1024, and at T = 1000 (a short last block)
WINDOWS = {"full-1024": (1024, 1024), "half-1024": (1024, 512), "short-1024": (1024, 128),
           "half-1000": (1000, 500), "short-1000": (1000, 128)}


@pytest.fixture(scope="module")
def fa3():
    try:
        return resolve_backend("fa3", DEVICE)
    except MuonlabError as exc:
        pytest.skip(f"FlashAttention-3 cannot be loaded here: {exc}")


def _attention(backend, inputs, dout, window, dtype, flash_attn_func=None):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in inputs)
    out = causal_attention(q, k, v, window, backend, flash_attn_func)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    return [t.float() for t in (out, *grads)]


def _check_backend(backend: str, case: str, flash_attn_func=None) -> None:
    T, left = WINDOWS[case]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    shapes = ((B, T, H, D), (B, T, H_KV, D), (B, T, H_KV, D))
    inputs = [torch.randn(s, device=DEVICE, generator=g).to(torch.bfloat16) for s in shapes]
    dout = torch.randn(B, T, H, D, device=DEVICE, generator=g).to(torch.bfloat16)
    w = (left, 0)
    ref = _attention("sdpa", inputs, dout, w, torch.float32)
    pt = _attention("sdpa", inputs, dout, w, torch.bfloat16)
    got = _attention(backend, inputs, dout, w, torch.bfloat16, flash_attn_func)
    for name, r, p, f in zip(("out", "dq", "dk", "dv"), ref, pt, got):
        assert torch.isfinite(f).all(), name
        err, pt_err = (f - r).abs().max().item(), (p - r).abs().max().item()
        atol = 1e-3 if name == "out" else 1e-3 * r.abs().max().item()
        assert err <= 2 * pt_err + atol, f"{case} {name}: {backend} error {err:.3g}, bf16 SDPA {pt_err:.3g}"
    if left < T - 1:  # the window acts: the tolerance above tells it from full causal attention
        full = _attention("sdpa", inputs, dout, (T, 0), torch.float32)[0]
        assert (full - ref[0]).abs().max().item() > 3 * (2 * (pt[0] - ref[0]).abs().max().item() + 1e-3)


@pytest.mark.parametrize("case", list(WINDOWS))
def test_fa3_matches_the_fp32_reference_forward_and_backward(fa3, case):
    _check_backend("fa3", case, fa3.flash_attn_func)


@pytest.mark.parametrize("case", list(WINDOWS))
def test_flex_attention_matches_the_fp32_reference_forward_and_backward(case):
    assert resolve_backend("flex", DEVICE).name == "flex"
    _check_backend("flex", case)


# ------------------------------------------------------------------------------ (b) compiled vs eager
CASES = representative_arms()
FIRST_TOL, LATER_TOL = 0.01, 0.03


@pytest.mark.parametrize("case", CASES, ids=[f"{c.arm}@{c.preset}" for c in CASES])
def test_compiled_training_matches_eager(case):
    overrides = {**CUDA_OVERRIDES, "runtime.device": DEVICE.type, "train.num_steps": case_steps(case.model_family)}
    cfg = resolve_config(case.arm, case.preset, overrides)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # as a CUDA run sets it (muonlab.train.run)
    try:
        eager, _ = train_losses(cfg, compiled=False)
        compiled, graphs = train_losses(cfg, compiled=True)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert graphs > 0, "torch.compile compiled no graph: the compiled run was eager"
    assert all(math.isfinite(x) for x in eager + compiled), (eager, compiled)
    assert max(abs(x - eager[0]) for x in eager[1:]) > 0.1, f"{case.arm}: the losses did not move ({eager})"
    for step, (e, c) in enumerate(zip(eager, compiled)):
        tol = FIRST_TOL if step == 0 else LATER_TOL
        assert abs(e - c) <= tol, f"{case.arm} step {step}: eager {e:.5f}, compiled {c:.5f} (tolerance {tol})"


# ------------------------------------------------------------------------------ (c) the LMO, CUDA vs CPU
def _table(dtype: torch.dtype, rows: int = 1536, d: int = 768) -> torch.Tensor:
    """Gaussian, heavy-tailed, sparse (support-limited), tied, zero and widely scaled rows."""
    g = torch.Generator().manual_seed(4)
    part = rows // 6
    gauss = torch.randn(part, d, generator=g, dtype=torch.float64)
    heavy = torch.randn(part, d, generator=g, dtype=torch.float64) ** 3
    sparse = torch.randn(part, d, generator=g, dtype=torch.float64) * (torch.rand(part, d, generator=g) < 0.05)
    ties = torch.randint(-3, 4, (part, d), generator=g).double()
    zero = torch.zeros(part, d, dtype=torch.float64)
    span = 150 if dtype == torch.float64 else 18  # rows whose squares leave fp range: the exact fp64 path
    rest = rows - 5 * part
    scaled = torch.randn(rest, d, generator=g, dtype=torch.float64) * 10.0 ** (
        (torch.rand(rest, 1, generator=g, dtype=torch.float64) * 2 - 1) * span)
    table = torch.cat([gauss, heavy, sparse, ties, zero, scaled])
    return table[torch.randperm(rows, generator=g)].to(dtype)


@pytest.mark.parametrize("method", ["sort", "newton"])
@pytest.mark.parametrize("cap", [1.0, 2.0, 3.0, math.inf], ids=["c1", "c2", "c3", "cinf"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_lmo_on_cuda_matches_cpu(dtype, cap, method):
    table = _table(dtype)
    cpu = clipped_row_lmo(table, cap)
    cuda = clipped_row_lmo(table.to(DEVICE), cap, method=method).cpu()
    assert cuda.dtype == cpu.dtype == dtype
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cuda, cpu, **tol)
    torch.testing.assert_close(lmo_objective(table, cuda), lmo_objective(table, cpu), rtol=tol["rtol"] * 10,
                               atol=tol["atol"] * 10)
