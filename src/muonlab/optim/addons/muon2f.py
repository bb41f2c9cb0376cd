"""Muon^2-F: the factored second moment moved before Polar Express (seed 000 §3.3).

    second_momentum_buffer.lerp_(mean(G^2, red_dim), 1 - beta2);  G <- G * buf^(-1/2)

before Polar Express "instead of after". Chosen (unstated in seed 000 §3.3): NorMuon's buffer
is reused (0 extra bytes), the post-polar NorMuon step is removed, rsqrt of clamp_min(1e-10) as
NorMuon, and no bias correction (1 - beta2^t is one scalar per matrix, which Polar Express's
Frobenius normalisation removes exactly). Acts on whole groups only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from muonlab.optim.extensions import PrePolar, register_prepolar


def muon2f_precondition(G: torch.Tensor, v_buffer: torch.Tensor, beta2, red_dim: int) -> torch.Tensor:
    """Factored one-sided second moment before Polar Express (Muon^2-F adaptation), in place."""
    v_buffer.lerp_(G.square().mean(dim=red_dim, keepdim=True).to(v_buffer.dtype), 1 - beta2)
    return G.mul_(v_buffer.clamp_min(1e-10).rsqrt().to(G.dtype))


@dataclass(frozen=True)
class Muon2F(PrePolar):
    WHOLE_GROUPS_ONLY = True

    def condition(self, G, inputs, ctx):
        return muon2f_precondition(G, ctx.second_momentum_buffer, ctx.beta2_t.to(G.dtype), ctx.red_dim)

    def stages(self, stages):
        return replace(stages, normuon=False)  # the second moment already acted before the polar step


register_prepolar("muon2f", Muon2F, paper="seed 000 §3.3", tests=("tests/optim/test_prepolar.py",),
                  summary="NorMuon's factored second moment before Polar Express instead of after")
