"""Seed 003's residual-addition variants: branch-credit VJPs and forward radius gates.

Seed 003 ("Residual geometry needs a causal test", spec-000-003 §1.E/§1.F) modifies the
residual additions y = u + f of every block (u: incoming stream [B, T, d], f: branch output).

Backward branch-credit intervention (`residual_add`). The forward is always bit-identical
to u + f; only the cotangents change. Per token vector y_t, P_y = I - y y^T / max(|y|^2, 1e-20):
  ordinary             g_u = g_y,      g_f = g_y           (plain autograd)
  branch_tangent       g_u = g_y,      g_f = P_y g_y       (stated by the paper)
  whole_state_tangent  g_u = P_y g_y,  g_f = P_y g_y       (name only in the paper; our reading)
  grad_mag_control     g_u = g_y,      g_f = g_y |P_y g_y| / max(|g_y|, 1e-20)
The last is the "matched projected-gradient-magnitude control": the magnitude of the branch
projection with the direction of g_y. The paper neither gives its formula nor says whether it
is matched to the branch or the whole-state rule; this is the branch-only version (skip
credit left ordinary), matching the branch-tangent arm it controls for. None of the three
is the derivative of the forward graph, deliberately.
Reductions run in fp32 and results are cast back to the gradient's dtype, as the paper
states. The custom rules save only y for backward (one [B, T, d] tensor; ordinary saves nothing).

Forward radius gates (`radius_gate_scale`): y = u + g_t f with g_t = exp(a + b z_t(v)),
z_t the causal prefix-standardised log RMS of v (v = u: "state"; v = f: "branch"; "neutral":
the same code with a = b = 0 frozen, so g == 1 exactly). Choices the paper leaves unstated,
all made here and exposed as options where they are numbers or switches:
  * z_t per batch row over positions 0..t: rho = 0.5 log(mean(v^2) + eps), running mean
    and population variance of rho, z = (rho - mu_t) / sqrt(max(var_t, 0) + eps).
  * eps = 1e-6 in both places.
  * statistics detached by default (detach_stats=True): gradients reach a, b and, through
    g, the multiplied f, but never v through z.
  * no reset at document boundaries: the prefix runs over the whole packed row.
  * arithmetic in fp32 (fp64 for fp64 inputs, so gradcheck is meaningful); g is cast to
    v.dtype at the end.
  * the running variance is taken of rho - rho_0 (the row's first value), which is exact in
    real arithmetic and keeps fp32 cumsums from cancelling when |rho| >> its spread.
"""

from __future__ import annotations

import torch

RESIDUAL_RULES = ("ordinary", "branch_tangent", "whole_state_tangent", "grad_mag_control")
RADIUS_GATES = ("none", "state", "branch", "neutral")

_NORM_SQ_FLOOR = 1e-20  # max(|y|^2, .) in P_y, as stated by the paper
_NORM_FLOOR = 1e-20  # max(|g_y|, .) in the magnitude control (unstated; same constant)


def _project(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """P_y g per token in fp32: g - (<y, g> / max(|y|^2, 1e-20)) y. Zero y gives g back."""
    y32, g32 = y.float(), g.float()
    coef = (y32 * g32).sum(-1, keepdim=True) / y32.square().sum(-1, keepdim=True).clamp_min(_NORM_SQ_FLOOR)
    return g32 - coef * y32


class _ResidualAdd(torch.autograd.Function):
    """y = u + f forward (bit-identical), saving only y; subclasses choose the cotangents."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        y = u + f
        ctx.save_for_backward(y)
        return y


class _BranchTangentAdd(_ResidualAdd):
    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return gy, _project(y, gy).to(gy.dtype)


class _WholeStateTangentAdd(_ResidualAdd):
    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (y,) = ctx.saved_tensors
        g = _project(y, gy).to(gy.dtype)
        return g, g  # one tensor for both inputs, as autograd's own AddBackward does


class _GradMagControlAdd(_ResidualAdd):
    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (y,) = ctx.saved_tensors
        g32 = gy.float()
        proj_norm = torch.linalg.vector_norm(_project(y, g32), dim=-1, keepdim=True)
        g_norm = torch.linalg.vector_norm(g32, dim=-1, keepdim=True).clamp_min(_NORM_FLOOR)
        return gy, (g32 * (proj_norm / g_norm)).to(gy.dtype)


_FUNCTIONS = {
    "branch_tangent": _BranchTangentAdd,
    "whole_state_tangent": _WholeStateTangentAdd,
    "grad_mag_control": _GradMagControlAdd,
}


def residual_add(u: torch.Tensor, f: torch.Tensor, rule: str = "ordinary") -> torch.Tensor:
    """y = u + f (bit-identical forward for every rule); `rule` picks the backward."""
    if rule == "ordinary":
        return u + f  # plain autograd: no custom Function, nothing saved
    fn = _FUNCTIONS.get(rule)
    if fn is None:
        raise ValueError(f"residual rule must be one of {', '.join(RESIDUAL_RULES)}, got {rule!r}")
    return fn.apply(u, f)


def prefix_log_rms_z(v: torch.Tensor, eps: float = 1e-6, detach: bool = True) -> torch.Tensor:
    """Causal prefix-standardised log RMS of v [B, T, d] -> z [B, T, 1] (fp32; fp64 for fp64 v).

    z[:, t] reads only v[:, :t+1] of its own row; z[:, 0] is exactly 0.
    """
    x = v.detach() if detach else v
    x = x.to(torch.promote_types(v.dtype, torch.float32))
    rho = 0.5 * torch.log(x.square().mean(-1) + eps)  # [B, T]
    r = rho - rho[:, :1]  # causal shift: rho_0 is in every prefix; variance and z are unchanged
    n = torch.arange(1, r.shape[-1] + 1, device=r.device, dtype=r.dtype)
    mu = r.cumsum(-1) / n
    var = r.square().cumsum(-1) / n - mu.square()
    z = (r - mu) / torch.sqrt(var.clamp_min(0) + eps)
    return z.unsqueeze(-1)


def radius_gate_scale(v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6,
                      detach_stats: bool = True) -> torch.Tensor:
    """Per-token gate g_t = exp(a + b z_t(v)) [B, T, 1], cast to v.dtype; a, b are 0-D scalars."""
    z = prefix_log_rms_z(v, eps=eps, detach=detach_stats)
    return torch.exp(a + b * z).to(v.dtype)
