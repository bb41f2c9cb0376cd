"""Branch-credit backward rules (seed 003 "Backward branch-credit intervention", Table
1) at the residual point of every block (u: incoming stream [B, T, d], f: branch output).
No parameters.

`residual_add`: the forward is always bit-identical
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

`use_rule(model, rule)` swaps the rule of a built model for a while (the replay diagnostic
compares rules on one checkpoint); outside it the table stays fixed, as torch.compile needs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import MethodInfo, setting

RESIDUAL_RULES = ("ordinary", "branch_tangent", "whole_state_tangent", "grad_mag_control")

_NORM_SQ_FLOOR = 1e-20  # max(|y|^2, .) in P_y, as stated by the paper
_NORM_FLOOR = 1e-20  # max(|g_y|, .) in the magnitude control (unstated; same constant)


def _acc(t: torch.Tensor) -> torch.dtype:
    """The reductions' dtype: at least fp32 (seed 003's FP32 accumulation), fp64 for fp64 inputs, so
    the FP64 gauge audit checks the rule itself, not an fp32 rounding of it."""
    return torch.promote_types(t.dtype, torch.float32)


def _project(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """P_y g per token in fp32 (fp64 for fp64): g - (<y, g> / max(|y|^2, 1e-20)) y. Zero y gives g back."""
    acc = torch.promote_types(_acc(y), g.dtype)
    y32, g32 = y.to(acc), g.to(acc)
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
        g32 = gy.to(_acc(gy))
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


@dataclass(frozen=True)
class ResidualRuleConfig(VariantConfig):
    """Seed 003: backward rules at every residual addition (the forward stays bit-identical). The run
    config's `model.residual` section and the configuration ResidualRule reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('residual_rule', 'seed 003 Backward branch-credit intervention (Table 1)', __name__,
                                              ('tests/model/test_residual.py', 'tests/model/test_model_variants.py', 'tests/papers/test_diagnostics_replay.py'), 'rule', 'ordinary')

    rule: Literal["ordinary", "branch_tangent", "whole_state_tangent", "grad_mag_control"] = setting(
        "ordinary", "backward rule", flag="residual-rule")


@register_variant("residual_rule", ResidualRuleConfig)  # its record: ResidualRuleConfig.METHOD
class ResidualRule(ModelVariant):
    def residual_add(self, u, f):
        return residual_add(u, f, self.cfg.rule)


@contextlib.contextmanager
def use_rule(model, rule: str):
    """Run `model` with residual rule `rule` ("ordinary": plain autograd) inside the block."""
    if rule not in RESIDUAL_RULES:
        raise ValueError(f"residual_rule must be one of {', '.join(RESIDUAL_RULES)}, got {rule!r}")
    points, previous = model.points, model.points.residual_add
    rule_hook = None if rule == "ordinary" else ResidualRule(ResidualRuleConfig(rule), model.config).residual_add
    points.residual_add = rule_hook
    try:
        yield model
    finally:
        points.residual_add = previous
