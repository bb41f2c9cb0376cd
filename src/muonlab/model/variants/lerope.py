"""LeRoPE (seed 000 §4.2 / Table 2 comparators, spec-000-003 §1.C) at the rotary point; the
reversible rotation and its backward are in muonlab.model.lerope.

"lerope_shared": tau [D/2] for every layer and head, fp32 trigonometry (close to, not bitwise,
the baseline's bf16 tables); "lerope_adapted": tau [L, H, D/2], bf16 trigonometry (bitwise the
baseline at tau = 0). Parameter `rope_tau` and the non-persistent buffer `inv_freq`; own AdamW
group, lr = scalar_lr x lr_mult.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.lerope import apply_lerope, inv_frequencies

KINDS = ("lerope_shared", "lerope_adapted")


@dataclass(frozen=True)
class LeRoPEConfig:
    kind: str = "lerope_shared"
    lr_mult: float = 0.04

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rope must be one of standard, {', '.join(KINDS)}, got {self.kind!r}")
        if self.lr_mult < 0:
            raise ValueError(f"rope_lr_mult must be >= 0, got {self.lr_mult}")


@register_variant("lerope", LeRoPEConfig, paper="seed 000", section="§4.2, Table 2 (spec-000-003 §1.C)",
                  switch=("rope", "standard"), keys={"rope": "kind", "rope_lr_mult": "lr_mult"},
                  lenient=("rope_lr_mult",), tests=("tests/test_lerope.py", "tests/test_model_variants.py"))
class LeRoPE(ModelVariant):
    param_names = ("rope_tau",)

    def __init__(self, cfg: LeRoPEConfig, config):
        super().__init__(cfg, config)
        self.shared = cfg.kind == "lerope_shared"
        self.trig = torch.float32 if self.shared else torch.bfloat16

    def create(self) -> None:
        c = self.config
        half = c.head_dim // 2
        self.model.rope_tau = nn.Parameter(torch.empty(half) if self.shared else torch.empty(c.n_layer, c.n_head, half))
        self.model.register_buffer("inv_freq", inv_frequencies(c.head_dim), persistent=False)

    def init_weights(self) -> None:
        self.model.rope_tau.zero_()  # LeRoPE = RoPE
        self.model.inv_freq = inv_frequencies(self.config.head_dim, device=self.model.rope_tau.device)

    def param_groups(self, lrs):
        return [lrs.adamw([self.model.rope_tau], lrs.scalar_lr * self.cfg.lr_mult)]

    def rotary(self, i, q, k, cos_sin):
        tau = self.model.rope_tau if self.shared else self.model.rope_tau[i]
        inv_freq = self.model.inv_freq
        return apply_lerope(q, tau, inv_freq, self.trig), apply_lerope(k, tau, inv_freq, self.trig)
