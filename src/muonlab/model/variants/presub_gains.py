"""Pre-sublayer channel gains (seed 000 §3.1, spec-000-003 §1.A) at the sublayer-input point.

Per layer a_attn, a_mlp in R^d scale x_hat = norm(x) on the inputs of W_Q, W_K, W_V and W_fc;
the ResFormer value-embedding gate keeps reading the unscaled x_hat[..., :32] (except in the
"gate_scaled" control). The implementations and parameterisations are documented with their
math in muonlab.model.scalings. Parameters: `presub_gains` [L, 2, d] (2 L d scalars), own AdamW
group with lr = scalar_lr x lr_mult (seed 000's "0.04" = 0.04 x scalar_lr).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from muonlab.model.extensions import ModelVariant, register_variant
from muonlab.model.scalings import PRESUB_GAINS, PRESUB_PARAMS, gain_init, gain_value


@dataclass(frozen=True)
class PresubGainsConfig:
    impl: str = "weight_fused"  # unfused_slice | unfused_contig | weight_fused | gate_scaled
    param: str = "linear"  # linear | stopexp
    lr_mult: float = 0.04

    def __post_init__(self):
        if self.impl not in PRESUB_GAINS[1:]:
            raise ValueError(f"presub_gains must be one of {', '.join(PRESUB_GAINS)}, got {self.impl!r}")
        if self.param not in PRESUB_PARAMS:
            raise ValueError(f"presub_param must be one of {', '.join(PRESUB_PARAMS)}, got {self.param!r}")
        if self.lr_mult < 0:
            raise ValueError(f"presub_lr_mult must be >= 0, got {self.lr_mult}")


@register_variant("presub_gains", PresubGainsConfig, paper="seed 000", section="§3.1 (spec-000-003 §1.A)",
                  switch=("presub_gains", "none"),
                  keys={"presub_gains": "impl", "presub_param": "param", "presub_lr_mult": "lr_mult"},
                  lenient=("presub_lr_mult",),
                  tests=("tests/test_model_variants.py", "tests/test_diagnostics_storage.py",
                         "tests/test_diagnostics_forward.py"))
class PresubGains(ModelVariant):
    param_names = ("presub_gains",)

    def __init__(self, cfg: PresubGainsConfig, config):
        super().__init__(cfg, config)
        fused = cfg.impl == "weight_fused"  # chosen once: no string test per step
        self.attn_input = self._attn_fused if fused else self._attn_unfused
        self.mlp_input = self._mlp_fused if fused else self._mlp_unfused
        self._gate_input = {"unfused_slice": lambda x, xs, c: x[..., :c],
                            "unfused_contig": lambda x, xs, c: x[..., :c].contiguous(),
                            "gate_scaled": lambda x, xs, c: xs[..., :c]}.get(cfg.impl)

    def create(self) -> None:
        c = self.config
        self.model.presub_gains = nn.Parameter(torch.empty(c.n_layer, 2, c.n_embd))

    def init_weights(self) -> None:
        self.model.presub_gains.fill_(gain_init(self.cfg.param))  # a gain of exactly 1

    def param_groups(self, lrs):
        return [lrs.adamw([self.model.presub_gains], lrs.scalar_lr * self.cfg.lr_mult)]

    def gain(self, layer: int, which: int) -> torch.Tensor:
        """The effective gain of layer `layer`, sublayer `which` (0 attention, 1 MLP): [d]."""
        return gain_value(self.model.presub_gains[layer][which], self.cfg.param)

    def _attn_fused(self, i, attn, x):
        w = self.gain(i, 0)[None, :]  # scales W's input columns: (W * a) x == W (a * x)
        return (F.linear(x, attn.c_q.weight * w), F.linear(x, attn.c_k.weight * w),
                F.linear(x, attn.c_v.weight * w), x[..., :attn.ve_gate_channels])

    def _attn_unfused(self, i, attn, x):
        xs = x * self.gain(i, 0)
        return attn.c_q(xs), attn.c_k(xs), attn.c_v(xs), self._gate_input(x, xs, attn.ve_gate_channels)

    def _mlp_fused(self, i, mlp, x):
        return F.linear(x, mlp.c_fc.weight * self.gain(i, 1)[None, :])

    def _mlp_unfused(self, i, mlp, x):
        return mlp.c_fc(x * self.gain(i, 1))
