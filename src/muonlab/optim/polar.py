"""Polar Express orthogonalisation (Amsel et al. 2025), as used by upstream MuonAdamW.

Each step applies the odd polynomial X <- a X + b (X X^T) X + c (X X^T)^2 X, with
per-step coefficients tuned so that the singular values of X approach 1. The input is
normalised by its Frobenius norm times a 1.02 safety factor (so the spectral norm is
safely below 1) and the iteration runs in bf16.

Options (muonlab, off by default; the default call is bitwise upstream):
  - `dtype=torch.float32`: the iteration in fp32 (seed 002 §"NS5 in FP32", spec-002 §1.4b).
    On CUDA, fp32 matmuls follow torch's float32 matmul precision (TF32 under "high").
  - `normalize="aol"`: Turbo-Muon's AOL diagonal Gram L1 scaling replaces the Frobenius
    normalisation (seed 000 §3.3, Boissin et al. 2025): with A0 = X^T X (m > n) or X X^T
    (m <= n), s_i = (sum_j |A0_ij|)^(-1/2) / 1.02, and X <- X diag(s) (tall, columns) or
    diag(s) X (otherwise, rows). Unstated in the paper (spec-000-003 §5.7), chosen here: A0 is
    formed in the iteration dtype (it replaces a line acting on the bf16 X); the first
    iteration reuses it (`reuse_gram=True`, as Turbo-Muon does: the Gram of the scaled X is
    diag(s) A0 diag(s), so AOL costs no extra matmul; seed 000's Turbo runs were also timed
    faster than its unconditioned baseline, consistent with reuse), `reuse_gram=False` forms
    that Gram again (same math, different bf16 rounding); the L1 row sum is clamped at the
    dtype's smallest normal number, which only changes an all-zero row/column (kept zero
    instead of 0 * inf = NaN).
"""

from __future__ import annotations

import torch

POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
FROBENIUS_SAFETY = 1.02
FROBENIUS_EPS = 1e-6
AOL_SAFETY = 1.02
NORMALIZATIONS = ("frobenius", "aol")


def aol_scale(X: torch.Tensor, safety: float = AOL_SAFETY, return_gram: bool = False):
    """Turbo-Muon's AOL scaling of each matrix of X [..., m, n] (see the module doc).

    With `return_gram`, also the Gram matrix of the scaled X on the smaller side,
    diag(s) A0 diag(s), for the first Polar Express iteration.
    """
    tall = X.size(-2) > X.size(-1)
    A0 = X.mT @ X if tall else X @ X.mT
    s = A0.abs().sum(dim=-1).clamp_min(torch.finfo(X.dtype).tiny).rsqrt() / safety
    scaled = X * s.unsqueeze(-2) if tall else X * s.unsqueeze(-1)
    if not return_gram:
        return scaled
    return scaled, A0 * s.unsqueeze(-1) * s.unsqueeze(-2)


def polar_express(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16,
                  normalize: str = "frobenius", reuse_gram: bool = True) -> torch.Tensor:
    """Approximate the polar factor U V^T of each matrix in g [..., m, n].

    The Gram matrix is formed on the smaller side: X^T X for tall inputs, X X^T otherwise.
    `reuse_gram` only matters for normalize="aol" (see the module doc).
    """
    if not 1 <= steps <= len(POLAR_EXPRESS_COEFFS):
        raise ValueError(f"ns_steps must be in 1..{len(POLAR_EXPRESS_COEFFS)}, got {steps}")
    X = g.to(dtype)
    gram = None  # the first iteration's Gram matrix, when the normalisation already formed it
    if normalize == "frobenius":
        X = X / (X.norm(dim=(-2, -1), keepdim=True) * FROBENIUS_SAFETY + FROBENIUS_EPS)
    elif normalize == "aol":
        X, gram = aol_scale(X, return_gram=True)
        gram = gram if reuse_gram else None
    else:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    if g.size(-2) > g.size(-1):
        for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
            A = X.mT @ X if gram is None else gram
            gram = None
            B = b * A + c * (A @ A)
            X = a * X + X @ B
    else:
        for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
            A = X @ X.mT if gram is None else gram
            gram = None
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    return X
