"""Forward radius gates (seed 003 "Forward radius and branch controls", spec-000-003 §1.F) at
the residual point: y = u + g_t f, g_t = exp(a + b z_t(v)), v = u ("state") or f ("branch");
"neutral" runs the same code with a = b = 0 frozen (lr 0), so g == 1 exactly. The gate's math
(prefix-standardised log RMS, its unstated choices) is in muonlab.model.residual.

Parameter `radius_gates` [L, 2, 2]: (a, b) per addition (attention, MLP), 32 scalars at depth 8;
own AdamW group, lr = scalar_lr x lr_mult (the lr is unstated in seed 003: seed 000's 0.04).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.residual import RADIUS_GATES, radius_gate_scale


@dataclass(frozen=True)
class RadiusGateConfig:
    kind: str = "state"  # state | branch | neutral
    lr_mult: float = 0.04

    def __post_init__(self):
        if self.kind not in RADIUS_GATES[1:]:
            raise ValueError(f"radius_gate must be one of {', '.join(RADIUS_GATES)}, got {self.kind!r}")
        if self.lr_mult < 0:
            raise ValueError(f"gate_lr_mult must be >= 0, got {self.lr_mult}")


@register_variant("radius_gate", RadiusGateConfig, paper="seed 003",
                  section="Forward radius and branch controls (spec-000-003 §1.F)",
                  switch=("radius_gate", "none"), keys={"radius_gate": "kind", "gate_lr_mult": "lr_mult"},
                  lenient=("gate_lr_mult",), tests=("tests/test_residual.py", "tests/test_model_variants.py"))
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
        return radius_gate_scale(u if self.on_state else f, a, b) * f
