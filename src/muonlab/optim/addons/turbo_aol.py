"""Turbo-Muon's AOL scaling in place of Polar Express's Frobenius normalisation (seed 000 §3.3).

Boissin et al. 2025, adapted on seed 000's common backbone (5-step Polar Express kept): with
A0 = X^T X (m > n) or X X^T (m <= n), s_i = (sum_j |A0_ij|)^(-1/2) / 1.02, and X <- X diag(s)
(tall, columns) or diag(s) X (otherwise, rows). Unstated in the paper (seed 000 §3.3),
chosen here: A0 is formed in the iteration dtype (it replaces a line acting on the bf16 X);
the first iteration reuses it (`reuse_gram`, group key `prepolar.reuse_gram`, default True, as Turbo-Muon does: the Gram of
the scaled X is diag(s) A0 diag(s), so AOL costs no extra matmul; seed 000's Turbo runs were
also timed faster than its unconditioned baseline, consistent with reuse); False forms that
Gram again (same math, different bf16 rounding); the L1 row sum is clamped at the dtype's
smallest normal number, which only changes an all-zero row/column (kept zero instead of
0 * inf = NaN). Selected with `prepolar.kind` = "turbo_aol"; stateless; whole groups only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from muonlab.optim.extensions import PrePolar, fixed, register_prepolar
from muonlab.optim.polar import matmul_for, register_normalization

AOL_SAFETY = 1.02


def aol_scale(X: torch.Tensor, safety: float = AOL_SAFETY, return_gram: bool = False):
    """Turbo-Muon's AOL scaling of each matrix of X [..., m, n] (see the module doc).

    With `return_gram`, also the Gram matrix of the scaled X on the smaller side,
    diag(s) A0 diag(s), for the first Polar Express iteration.
    """
    tall = X.size(-2) > X.size(-1)
    mm = matmul_for(X)  # the iteration's product: fp32-formed bf16 on CPUs without bf16 units
    A0 = mm(X.mT, X) if tall else mm(X, X.mT)
    s = A0.abs().sum(dim=-1).clamp_min(torch.finfo(X.dtype).tiny).rsqrt() / safety
    scaled = X * s.unsqueeze(-2) if tall else X * s.unsqueeze(-1)
    if not return_gram:
        return scaled
    return scaled, A0 * s.unsqueeze(-1) * s.unsqueeze(-2)


register_normalization("aol", lambda X: aol_scale(X, return_gram=True))


@dataclass(frozen=True)
class TurboAOL(PrePolar):
    WHOLE_GROUPS_ONLY = True

    reuse_gram: bool = fixed(True, "in Python only (False: the ablation without the reused Gram)")

    def stages(self, stages):
        return replace(stages, polar=replace(stages.polar, normalize="aol", reuse_gram=self.reuse_gram))


register_prepolar("turbo_aol", TurboAOL, paper="seed 000 §3.3 (Turbo-Muon, Boissin et al. 2025)",
                  tests=("tests/optim/test_prepolar.py", "tests/optim/test_prepolar_arms.py"),
                  summary="AOL Gram L1 scaling replaces the Frobenius normalisation of Polar Express")
