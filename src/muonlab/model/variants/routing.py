"""Decoupled residual routing (seed 002, §2.1 Tier 3) at the token-embedding point.

Before block i the stream gets wte_lambdas[i] * a_w, with the token-embedding anchor a_w:
"sepden" norm(w) (its own denominator); "shden" w / s_{w+e}(eps), the fused anchor's
denominator recomputed in fp32 with `eps` (1e-6, or 2**-23 = F.rms_norm's fp32 default,
"f32eps"), so a x0 + b a_w = (a e + (a + b) w) / s_{w+e}. With `out`, out_lambdas[0] * x0 +
out_lambdas[1] * a_w joins the stream before the final norm. All lambdas start at 0 (the fused
forward) and join x0_lambdas' AdamW settings (lr scalar_lr, betas (0.96, 0.95)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from muonlab.model import gpt
from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import MethodInfo, setting

KINDS = ("sepden", "shden")


@dataclass(frozen=True)
class RoutingConfig(VariantConfig):
    """Seed 002 §2.1 (Tier 3): decoupled residual routing of the token embedding. The run config's
    `model.routing` section and the configuration Routing reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('routing', 'seed 002 §2.1 (Tier 3): decoupled x0 routing', __name__,
                                              ('tests/model/test_over_encoding_model.py', 'tests/optim/test_step0.py', 'tests/papers/test_diagnostics_step0_audit.py'), 'kind', 'none')

    kind: Literal["none", "sepden", "shden"] = setting("none", "separate or shared denominator anchor", flag="routing")
    out: bool = setting(False, "also out_lambdas before the final norm", flag="routing-out")
    eps: float = setting(1e-6, "shden: the anchor's epsilon (1e-6, or 2**-23 as F.rms_norm)", flag="routing-eps")

    def inactive(self) -> dict[str, str]:
        return {"eps": "only the shared-denominator anchor has an epsilon"} if self.kind == "sepden" else super().inactive()


@register_variant("routing", RoutingConfig)  # its record: RoutingConfig.METHOD
class Routing(ModelVariant):
    def create(self) -> None:
        self.model.wte_lambdas = nn.Parameter(torch.empty(self.config.n_layer))
        if self.cfg.out:
            self.model.out_lambdas = nn.Parameter(torch.empty(2))

    def parameters(self):
        names = ("wte_lambdas", "out_lambdas") if self.cfg.out else ("wte_lambdas",)
        return {n: getattr(self.model, n) for n in names}

    def init_weights(self) -> None:
        for p in self.parameters().values():
            p.zero_()  # routing starts off: the fused forward

    def param_groups(self, lrs):
        return [lrs.adamw([p], lrs.scalar_lr, betas=(0.96, 0.95)) for p in self.parameters().values()]

    def anchor(self, w: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
        """a_w of the module docstring (gpt.norm looked up at call time: the step-0 audit swaps it)."""
        if self.cfg.kind == "sepden":
            return gpt.norm(w)
        w_plus_e = w if e is None else w + e
        inv_rms = torch.rsqrt(w_plus_e.float().square().mean(-1, keepdim=True) + self.cfg.eps)
        return (w.float() * inv_rms).to(w.dtype)

    def stream(self, w, e):
        return self.anchor(w, e)

    def block_input(self, i, x, a_w):
        return x + self.model.wte_lambdas[i] * a_w

    def head_input(self, x, x0, a_w):
        if not self.cfg.out:
            return x
        return x + self.model.out_lambdas[0] * x0 + self.model.out_lambdas[1] * a_w
