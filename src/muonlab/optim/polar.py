"""The polar iterations, each as its paper uses it: Polar Express (Amsel et al. 2025), upstream
MuonAdamW's, and the quintic Newton–Schulz of AF-Muon (seed 004 §2.2, Keller Jordan's Muon
coefficients). Their coefficient schedules stand side by side below.

Polar Express:

Each step applies the odd polynomial X <- a X + b (X X^T) X + c (X X^T)^2 X, with
per-step coefficients tuned so that the singular values of X approach 1. The input is
normalised by its Frobenius norm times a 1.02 safety factor (so the spectral norm is
safely below 1) and the iteration runs in bf16.

On a CPU without native bf16 matrix units (no AVX512-BF16 or AMX: torch then runs bf16 batched
matmuls some 25-55x slower than fp32), each bf16 product of either iteration (Polar Express and
AF-Muon's Newton–Schulz) is formed as an fp32 product of the bf16 operands rounded to bf16: exact
products, fp32 accumulation, one rounding, as a bf16 GEMM (a GPU's included) does, in a different
summation order (about 1 element in 10^4 then differs by one bf16 ulp).

Options (muonlab's polar stage, off by default; the default call is bitwise upstream on CUDA):
  - `dtype`: the iteration dtype (addons/polar_precision.py: fp32, seed 002 §2.1 (Tier 1)). On CUDA,
    fp32 matmuls follow torch's float32 matmul precision (TF32 under "high").
  - `normalize`: a registered normalisation replacing the Frobenius one (register_normalization;
    addons/turbo_aol.py registers "aol"). A normalisation returns the scaled X and, when it
    formed it anyway, the Gram matrix of the scaled X on the smaller side, which the first
    iteration reuses when `reuse_gram` (else that Gram is formed again: same math, other rounding).
"""

from __future__ import annotations

from typing import Callable

import torch

from muonlab.device import cpu_has_native_bf16

POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
FROBENIUS_SAFETY = 1.02
FROBENIUS_EPS = 1e-6
# AF-Muon's Newton–Schulz: one (a, b, c) for every step, Frobenius norm + 1e-7, bf16 matmuls
NS_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7

EMULATE_CPU_BF16_MATMUL = not cpu_has_native_bf16()  # decided once per process


def matmul_for(X: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if X.dtype == torch.bfloat16 and X.device.type == "cpu" and EMULATE_CPU_BF16_MATMUL:
        return lambda x, y: (x.float() @ y.float()).to(torch.bfloat16)
    return torch.matmul


# name -> X -> (scaled X, its Gram matrix or None)
_NORMALIZERS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]] = {}


def register_normalization(name: str, fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    """Make `polar_express(..., normalize=name)` use `fn` instead of the Frobenius normalisation."""
    if name == "frobenius" or name in _NORMALIZERS:
        raise ValueError(f"normalisation {name!r} is already registered")
    _NORMALIZERS[name] = fn


def normalizations() -> tuple[str, ...]:
    return ("frobenius", *_NORMALIZERS)


def polar_express(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16,
                  normalize: str = "frobenius", reuse_gram: bool = True) -> torch.Tensor:
    """Approximate the polar factor U V^T of each matrix in g [..., m, n].

    The Gram matrix is formed on the smaller side: X^T X for tall inputs, X X^T otherwise.
    """
    if not 1 <= steps <= len(POLAR_EXPRESS_COEFFS):
        raise ValueError(f"ns_steps must be in 1..{len(POLAR_EXPRESS_COEFFS)}, got {steps}")
    X = g.to(dtype)
    gram = None  # the first iteration's Gram matrix, when the normalisation already formed it
    if normalize == "frobenius":
        X = X / (X.norm(dim=(-2, -1), keepdim=True) * FROBENIUS_SAFETY + FROBENIUS_EPS)
    elif normalize in _NORMALIZERS:
        X, gram = _NORMALIZERS[normalize](X)
        gram = gram if reuse_gram else None
    else:
        raise ValueError(f"normalize must be one of {normalizations()}, got {normalize!r}")
    mm = matmul_for(X)
    if g.size(-2) > g.size(-1):
        for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
            A = mm(X.mT, X) if gram is None else gram
            gram = None
            B = b * A + c * mm(A, A)
            X = a * X + mm(X, B)
    else:
        for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
            A = mm(X, X.mT) if gram is None else gram
            gram = None
            B = b * A + c * mm(A, A)
            X = a * X + mm(B, X)
    return X


def newton_schulz(G: torch.Tensor, steps: int = 5, eps: float = NS_EPS) -> torch.Tensor:
    """Quintic Newton–Schulz (a, b, c) = NS_COEFFS in bf16: Frobenius-normalise (+eps), iterate
    X <- aX + (bA + cA^2)X with A = XX^T on the wide orientation. Returns bf16, G's shape.
    Its bf16 products are Polar Express's (matmul_for): a CPU without bf16 units forms them in fp32."""
    if G.ndim < 2:
        raise ValueError(f"newton_schulz needs a >= 2-D tensor, got shape {tuple(G.shape)}")
    X = (G.reshape(G.shape[0], -1) if G.ndim > 3 else G).to(torch.bfloat16)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    mm = matmul_for(X)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        A = mm(X, X.mT)
        X = a * X + mm(b * A + c * mm(A, A), X)
    return (X.mT if tall else X).reshape(G.shape)
