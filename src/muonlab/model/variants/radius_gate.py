"""Forward radius gates (seed 003 "Forward radius and branch controls", Table 2) at
the residual point of every block (u: incoming stream [B, T, d], f: branch output).

`radius_gate_scale`: y = u + g_t f with g_t = exp(a + b z_t(v)),
z_t the causal prefix-standardised log RMS of v (v = u: "state"; v = f: "branch"; "neutral":
the same code with a = b = 0 frozen, so g == 1 exactly). Choices the paper leaves unstated,
all made here and exposed as options where they are numbers or switches:
  * z_t per batch row over positions 0..t: rho = 0.5 log(mean(v^2) + eps), running mean
    and population variance of rho, z = (rho - mu_t) / sqrt(max(var_t, 0) + eps).
  * eps = 1e-6 in both places.
  * ordinary autograd through the prefix statistics by default, as seed 003 states ("identical
    initialization, ordinary autograd"): gradients reach v through z as well as a, b and f.
    `--gate-detach-stats` detaches z from v instead (gradients reach a, b and f only).
  * no reset at document boundaries: the prefix runs over the whole packed row.
  * arithmetic in fp32 (fp64 for fp64 inputs, so gradcheck is meaningful); g is cast to
    v.dtype at the end.
  * the running variance is taken of rho - rho_0 (the row's first value), which is exact in
    real arithmetic and keeps fp32 cumsums from cancelling when |rho| >> its spread.

Parameter `radius_gates` [L, 2, 2]: (a, b) per addition (attention, MLP), 32 scalars at depth 8;
own AdamW group, lr = scalar_lr x lr_mult (the lr is unstated in seed 003: seed 000's 0.04).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import NON_NEGATIVE, MethodInfo, setting

RADIUS_GATES = ("none", "state", "branch", "neutral")


def prefix_log_rms_z(v: torch.Tensor, eps: float = 1e-6, detach: bool = False) -> torch.Tensor:
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
                      detach_stats: bool = False) -> torch.Tensor:
    """Per-token gate g_t = exp(a + b z_t(v)) [B, T, 1], cast to v.dtype; a, b are 0-D scalars."""
    z = prefix_log_rms_z(v, eps=eps, detach=detach_stats)
    return torch.exp(a + b * z).to(v.dtype)


@dataclass(frozen=True)
class RadiusGateConfig(VariantConfig):
    """Seed 003: y = u + exp(a + b z_t) f with z_t the causal prefix-standardised log RMS. The run
    config's `model.gate` section and the configuration RadiusGate reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('radius_gate', 'seed 003 Forward radius and branch controls (Table 2)', __name__,
                                              ('tests/model/test_residual.py', 'tests/model/test_model_variants.py'), 'kind', 'none')

    kind: Literal["none", "state", "branch", "neutral"] = setting("none", "what the gate reads (neutral: frozen at 0)",
                                                                 flag="radius-gate")
    lr_mult: float = setting(0.04, "gates' AdamW lr as a multiple of scalar_lr (unstated in seed 003)",
                             flag="gate-lr-mult", range=NON_NEGATIVE)
    detach_stats: bool = setting(False, "detach the prefix statistics z_t from v (seed 003 uses ordinary autograd "
                                        "through them: off)", flag="gate-detach-stats")

    def inactive(self) -> dict[str, str]:
        # a frozen neutral gate has a = b = 0, so no gradient reaches z either way
        return {"lr_mult": "the neutral gate is frozen", "detach_stats": "the neutral gate is frozen"} \
            if self.kind == "neutral" else super().inactive()


@register_variant("radius_gate", RadiusGateConfig)  # its record: RadiusGateConfig.METHOD
class RadiusGate(ModelVariant):
    param_names = ("radius_gates",)

    def __init__(self, cfg: RadiusGateConfig, config):
        super().__init__(cfg, config)
        self.on_state = cfg.kind == "state"

    def create(self) -> None:
        self.model.radius_gates = nn.Parameter(torch.empty(self.config.n_layer, 2, 2))

    def init_weights(self) -> None:
        self.model.radius_gates.zero_()  # g = exp(0) = 1

    def param_groups(self, lrs):
        lr = 0.0 if self.cfg.kind == "neutral" else lrs.scalar_lr * self.cfg.lr_mult
        return [lrs.adamw([self.model.radius_gates], lr)]

    def branch(self, i, slot, u, f):
        gate = self.model.radius_gates[i]
        a, b = gate[slot, 0], gate[slot, 1]
        return radius_gate_scale(u if self.on_state else f, a, b, detach_stats=self.cfg.detach_stats) * f
