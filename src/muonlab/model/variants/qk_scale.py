"""Post-QK-norm scaling (seed 000 §3.2, spec-000-003 §1.B) at the post-QK-norm point, with
seed 002's freeze mask QMASK (spec-002 §1.5); the math is in muonlab.model.scalings.

Parameters: `qk_scales` ([L, H, D/2] pair-tied, [L, H, D] untied, [L, H] head_temp) and, with a
freeze mask, the non-persistent 0/1 buffer `qk_mask`; own AdamW group, lr = scalar_lr x lr_mult
(seed 000's exp03 "qk_lr 0.10" = 0.10 x scalar_lr).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.scalings import QK_SCALES, apply_qk_scale, qk_freeze_mask, qk_init, qk_param_shape


@dataclass(frozen=True)
class QKScaleConfig:
    kind: str = "pair_tied_stopexp"  # pair_tied_linear | pair_tied_stopexp | pair_tied_exp | untied_stopexp | head_temp
    freeze_layers: tuple[int, ...] = ()  # seed 002 QMASK: layers whose scales stay at 1
    freeze_planes: int = 0  # ... and RoPE planes c < this, in every layer
    lr_mult: float = 0.04

    def __post_init__(self):
        if self.kind not in QK_SCALES[1:]:
            raise ValueError(f"qk_scale must be one of {', '.join(QK_SCALES)}, got {self.kind!r}")
        object.__setattr__(self, "freeze_layers", tuple(self.freeze_layers))
        if self.lr_mult < 0:
            raise ValueError(f"qk_lr_mult must be >= 0, got {self.lr_mult}")

    def shape(self, config) -> tuple[int, ...]:
        return qk_param_shape(self.kind, config.n_layer, config.n_head, config.head_dim)

    def mask(self, config) -> torch.Tensor | None:
        return qk_freeze_mask(self.kind, self.shape(config), self.freeze_layers, self.freeze_planes)

    def validate(self, config) -> None:
        if self.kind == "pair_tied_linear" and config.n_kv_head != config.n_head:
            raise ValueError("qk_scale=pair_tied_linear scales k per query head: it needs n_kv_head == n_head")
        with torch.device("meta"):  # the mask's own range checks, without allocating
            self.mask(config)


@register_variant("qk_scale", QKScaleConfig, paper="seed 000", section="§3.2 (spec-000-003 §1.B; QMASK spec-002 §1.5)",
                  switch=("qk_scale", "none"),
                  keys={"qk_scale": "kind", "qk_freeze_layers": "freeze_layers", "qk_freeze_planes": "freeze_planes",
                        "qk_lr_mult": "lr_mult"},
                  lenient=("qk_lr_mult",),
                  tests=("tests/test_model_variants.py", "tests/test_diagnostics_audit002.py",
                         "tests/test_diagnostics_forward.py"))
class QKScale(ModelVariant):
    param_names = ("qk_scales",)

    def create(self) -> None:
        self.model.qk_scales = nn.Parameter(torch.empty(self.cfg.shape(self.config)))
        mask = self.cfg.mask(self.config)
        self.masked = mask is not None
        if self.masked:  # q_eff = tau * M: frozen entries stay at scale 1 with zero gradient
            self.model.register_buffer("qk_mask", mask, persistent=False)

    def init_weights(self) -> None:
        self.model.qk_scales.fill_(qk_init(self.cfg.kind))  # scale 1
        if self.masked:
            self.model.qk_mask = self.cfg.mask(self.config).to(self.model.qk_scales.device)

    def param_groups(self, lrs):
        return [lrs.adamw([self.model.qk_scales], lrs.scalar_lr * self.cfg.lr_mult)]

    def qk(self, i, q, k):
        mask = self.model.qk_mask[i] if self.masked else None
        return apply_qk_scale(q, k, self.model.qk_scales[i], self.cfg.kind, mask)
