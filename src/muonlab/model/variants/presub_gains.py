"""Pre-sublayer channel gains (seed 000 §3.1, Tables 1–2) at the sublayer-input point.

Per layer a_attn, a_mlp in R^d scale the pre-norm output x_hat = norm(x) on the inputs of W_Q,
W_K, W_V and of W_fc; the ResFormer value-embedding gate keeps reading the UNSCALED
x_hat[..., :32]. Implementations (`impl`), the first three exact (equal up to fp32 rounding):
  - "unfused_slice":  xs = x_hat * a; q, k, v = c_q(xs), ...; gate reads the slice view
    x_hat[..., :32] (its storage is the whole x_hat, which backward then keeps alive);
  - "unfused_contig": the same, the gate reads x_hat[..., :32].contiguous() (a compact copy);
  - "weight_fused":   q = F.linear(x_hat, W_Q * a[None, :]) etc. (scales W's input columns);
  - "gate_scaled":    NOT equivalent: the gate reads the scaled slice (x_hat * a)[..., :32].
    The paper does not describe it (seed 000 names it only in Table 1); this is one of two plausible readings.
Parameterisation (`param`): "linear" (a used directly, init 1) or "stopexp" (a = stop_exp(beta),
init beta = 0); the paper does not state which the stop-exp arms used for their gains (seed 000 Table 2 gives only their lr 0.04):
"linear" is the default.

Parameters: `presub_gains` [L, 2, d] (2 L d scalars: 8,192 at depth 8), own AdamW group with
lr = scalar_lr x lr_mult (seed 000's "0.04" = 0.04 x scalar_lr; exp07's "sub_lr 0.05" likewise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.model.variants.qk_scale import stop_exp
from muonlab.settings import NON_NEGATIVE, MethodInfo, setting

PRESUB_GAINS = ("none", "unfused_slice", "unfused_contig", "weight_fused", "gate_scaled")
PRESUB_PARAMS = ("linear", "stopexp")


def gain_init(param: str) -> float:
    """Initial raw value: 1 for linear, 0 for stopexp (both give a gain of exactly 1)."""
    return 1.0 if param == "linear" else 0.0


def gain_value(raw: torch.Tensor, param: str) -> torch.Tensor:
    return raw if param == "linear" else stop_exp(raw)


@dataclass(frozen=True)
class PresubGainsConfig(VariantConfig):
    """Seed 000 §3.1: per-layer channel gains on the inputs of W_Q, W_K, W_V and W_fc. The run config's
    `model.gains` section and the configuration PresubGains reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('presub_gains', 'seed 000 §3.1 (Tables 1–2)', __name__,
                                              ('tests/model/test_model_variants.py', 'tests/papers/test_diagnostics_storage.py', 'tests/diagnostics/test_diagnostics_forward.py'), 'impl', 'none')

    impl: Literal["none", "unfused_slice", "unfused_contig", "weight_fused", "gate_scaled"] = setting(
        "none", "implementation (gate_scaled: the non-equivalent control)", flag="presub-gains")
    param: Literal["linear", "stopexp"] = setting("linear", "gain parametrisation", flag="presub-param")
    lr_mult: float = setting(0.04, "gains' AdamW lr as a multiple of scalar_lr (seed 000's 0.04)", flag="presub-lr-mult",
                             range=NON_NEGATIVE)


@register_variant("presub_gains", PresubGainsConfig)  # its record: PresubGainsConfig.METHOD
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
