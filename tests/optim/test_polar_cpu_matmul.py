"""Polar Express's bf16 products on a CPU without native bf16 matrix units (optim/polar.py):
formed in fp32 from the bf16 operands and rounded once, they are a bf16 GEMM's result (exact
products, fp32 sums, one rounding) up to the summation order."""

import pytest
import torch

import muonlab.optim.polar as polar


def _bf16_gemm_reference(x, y):
    """Exact sums of the exact products (float64), rounded once to bf16."""
    return (x.double() @ y.double()).to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(6, 192, 192), (2, 256, 64), (3, 64, 300)])
def test_emulated_product_is_a_bf16_gemm_within_one_ulp(shape, monkeypatch):
    monkeypatch.setattr(polar, "EMULATE_CPU_BF16_MATMUL", True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen).bfloat16()
    y = torch.randn(shape[0], shape[2], shape[1], generator=gen).bfloat16()
    got = polar.matmul_for(x)(x, y)
    ref = _bf16_gemm_reference(x, y)
    assert got.dtype == torch.bfloat16
    # one bf16 rounding of the result, plus fp32 summation error (K terms) that the rounding can
    # push across a bf16 boundary: bounded by K eps32 sum|x||y| (standard GEMM error bound)
    K = x.shape[-1]
    sum_abs = x.double().abs() @ y.double().abs()
    bound = torch.finfo(torch.bfloat16).eps * ref.double().abs() + K * torch.finfo(torch.float32).eps * sum_abs
    assert ((got.double() - ref.double()).abs() <= bound).all()
    assert (got == ref).double().mean() > 0.99  # the summation order moves a rare element by an ulp


def test_the_native_product_is_kept_elsewhere(monkeypatch):
    x = torch.randn(4, 8).bfloat16()
    monkeypatch.setattr(polar, "EMULATE_CPU_BF16_MATMUL", False)
    assert polar.matmul_for(x) is torch.matmul  # CPUs with AVX512-BF16 / AMX
    monkeypatch.setattr(polar, "EMULATE_CPU_BF16_MATMUL", True)
    assert polar.matmul_for(x.float()) is torch.matmul  # fp32 iterations (seed 002 §2.1 (Tier 1)) untouched


def test_polar_express_with_either_product_agrees(monkeypatch):
    """Both paths give the same polar factor to bf16 precision (the iteration is the same)."""
    g = torch.randn(2, 96, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    for flag in (False, True):
        monkeypatch.setattr(polar, "EMULATE_CPU_BF16_MATMUL", flag)
        out[flag] = polar.polar_express(g).float()
    assert (out[True] - out[False]).norm() / out[False].norm() < 2e-2


def _emulated(x, y):
    return (x.float() @ y.float()).bfloat16()


def _native(x, y):
    return x @ y


def _ns_transcription(G, mm):
    """AF-Muon's quintic (seed 004 §2.2) on a tall G, with the product mm: iterated on G's transpose."""
    X = G.bfloat16().T
    X = X / (X.norm() + polar.NS_EPS)
    a, b, c = polar.NS_COEFFS
    for _ in range(5):
        A = mm(X, X.T)
        X = a * X + mm(b * A + c * mm(A, A), X)
    return X.T


@pytest.mark.parametrize("flag", [True, False])
def test_newton_schulz_forms_its_products_as_polar_express_does(flag, monkeypatch):
    """AF-Muon's Newton–Schulz takes the same product: on a CPU without bf16 units each bf16 product
    formed in fp32 and rounded once, else torch's own bf16 matmul."""
    monkeypatch.setattr(polar, "EMULATE_CPU_BF16_MATMUL", flag)
    G = torch.randn(512, 96, generator=torch.Generator().manual_seed(5))  # K = 512: the products round apart
    mine, other = (_emulated, _native) if flag else (_native, _emulated)
    assert torch.equal(polar.newton_schulz(G), _ns_transcription(G, mine))
    assert not torch.equal(polar.newton_schulz(G), _ns_transcription(G, other))
