"""Post-QK-norm scaling (seed 000 §3.2, Tables 2–3) at the post-QK-norm point, with
seed 002's freeze mask QMASK (§4.2.2, Table 5b).

After q, k = norm(q), norm(k), before attention, on the half-split RoPE layout where plane
c = channels (c, c + D/2):
  - "pair_tied_linear":  s [L, H, D/2], init 1; q, k <- q * [s, s], k * [s, s] (both: metric s^2);
  - "pair_tied_stopexp": tau [L, H, D/2], init 0; q <- q * [m, m], m = stop_exp(tau) (q only);
  - "pair_tied_exp":     as above with a plain exp (seed 002's q_tau, §2.1 Tier 2);
  - "untied_stopexp":    tau [L, H, D], q <- q * stop_exp(tau) (nGPT-like, planes not tied);
  - "head_temp":         tau [L, H], q <- q * exp(tau) per head (exp not stopped: unstated).
Proposition 1 (seed 000): pair tying is necessary and sufficient for unit-shift invariance
of the logits (see muonlab.papers.seed000.diagnostics.equivalence). A freeze mask (`freeze_layers`,
`freeze_planes`, seed 002's QMASK) multiplies tau by a fixed 0/1 mask (q_eff = tau * M),
so frozen entries stay at scale 1 and get zero gradient.
dtype (unstated): the scale is cast to q's dtype before the product (FA3 needs bf16 q).

Parameters: `qk_scales` ([L, H, D/2] pair-tied, [L, H, D] untied, [L, H] head_temp) and, with a
freeze mask, the non-persistent 0/1 buffer `qk_mask`; own AdamW group, lr = scalar_lr x lr_mult
(seed 000's exp03 "qk_lr 0.10" = 0.10 x scalar_lr).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import COUNT, NON_NEGATIVE, MethodInfo, comma_items, setting

QK_SCALES = ("none", "pair_tied_linear", "pair_tied_stopexp", "pair_tied_exp", "untied_stopexp", "head_temp")


def stop_exp(tau: torch.Tensor) -> torch.Tensor:
    """exp(sg(tau)) + tau - sg(tau): forward value e^tau, backward Jacobian 1 (seed 000 §3.2)."""
    return tau.exp().detach() + tau - tau.detach()


def qk_param_shape(kind: str, n_layer: int, n_head: int, head_dim: int) -> tuple[int, ...]:
    if kind.startswith("pair_tied"):
        return (n_layer, n_head, head_dim // 2)
    if kind == "untied_stopexp":
        return (n_layer, n_head, head_dim)
    if kind == "head_temp":
        return (n_layer, n_head)
    raise ValueError(f"qk_scale must be one of {QK_SCALES}, got {kind!r}")


def qk_init(kind: str) -> float:
    return 1.0 if kind == "pair_tied_linear" else 0.0


def qk_freeze_mask(kind: str, shape: tuple[int, ...], layers: tuple[int, ...], planes: int) -> torch.Tensor | None:
    """0/1 mask (0 = frozen at scale 1): whole layers `layers`, and planes c < `planes` of every layer."""
    if not layers and planes <= 0:
        return None
    if kind == "pair_tied_linear":
        raise ValueError("qk freeze masks act on log-scales (tau); pair_tied_linear has no log-scale")
    mask = torch.ones(shape)
    for layer in layers:
        if not 0 <= layer < shape[0]:
            raise ValueError(f"qk_freeze_layers: layer {layer} out of range 0..{shape[0] - 1}")
        mask[layer] = 0
    if planes > 0:
        if kind == "head_temp":
            raise ValueError("qk_freeze_planes needs a per-plane scale, not head_temp")
        half = shape[-1] if kind.startswith("pair_tied") else shape[-1] // 2
        mask[..., :planes] = 0
        if kind == "untied_stopexp":  # plane c is channels c and c + D/2
            mask[..., half:half + planes] = 0
    return mask


def qk_multiplier(raw: torch.Tensor, kind: str, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The per-channel multiplier of q for one layer: [H, D] (or [H, 1] for head_temp)."""
    if mask is not None:
        raw = raw * mask
    if kind == "pair_tied_linear":
        return torch.cat([raw, raw], dim=-1)
    if kind == "pair_tied_stopexp":
        m = stop_exp(raw)
        return torch.cat([m, m], dim=-1)
    if kind == "pair_tied_exp":
        m = raw.exp()
        return torch.cat([m, m], dim=-1)
    if kind == "untied_stopexp":
        return stop_exp(raw)
    if kind == "head_temp":
        return raw.exp().unsqueeze(-1)
    raise ValueError(f"qk_scale must be one of {QK_SCALES}, got {kind!r}")


def apply_qk_scale(q: torch.Tensor, k: torch.Tensor, raw: torch.Tensor, kind: str,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale post-norm q [B, T, H, D] (and k for pair_tied_linear) by one layer's parameters."""
    m = qk_multiplier(raw, kind, mask).to(q.dtype)
    if kind == "pair_tied_linear":  # both q and k (needs n_kv_head == n_head): the logit metric is s^2
        return q * m, k * m
    return q * m, k


@dataclass(frozen=True)
class QKScaleConfig(VariantConfig):
    """Seed 000 §3.2, seed 002 §2.1 (Tier 2), §4.2.2: post-QK-norm scaling, plane c = channels c and c + 64.
    The run config's `model.qk` section and the configuration QKScale reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('qk_scale', 'seed 000 §3.2 (Tables 2–3); seed 002 §2.1 (Tier 2), §4.2.2 (q_tau, QMASK, Table 5b)', __name__,
                                              ('tests/model/test_model_variants.py', 'tests/papers/test_diagnostics_audit002.py', 'tests/diagnostics/test_diagnostics_forward.py'), 'kind', 'none')

    kind: Literal["none", "pair_tied_linear", "pair_tied_stopexp", "pair_tied_exp", "untied_stopexp", "head_temp"] = \
        setting("none", "scaling rule", flag="qk-scale")
    freeze_layers: str = setting("", "comma-separated layers whose scales stay 1 (seed 002 QMASK: 0)",
                                 flag="qk-freeze-layers")
    freeze_planes: int = setting(0, "RoPE planes c < this stay 1 in every layer (QMASK: 16)", flag="qk-freeze-planes",
                                 range=COUNT)
    lr_mult: float = setting(0.04, "scales' AdamW lr as a multiple of scalar_lr", flag="qk-lr-mult",
                             range=NON_NEGATIVE)

    def layers(self) -> tuple[int, ...]:
        return tuple(comma_items(self.freeze_layers, "qk_freeze_layers", int))

    def validate(self) -> None:
        self.layers()

    def shape(self, config) -> tuple[int, ...]:
        return qk_param_shape(self.kind, config.n_layer, config.n_head, config.head_dim)

    def mask(self, config) -> torch.Tensor | None:
        return qk_freeze_mask(self.kind, self.shape(config), self.layers(), self.freeze_planes)

    def check_model(self, config) -> None:
        super().check_model(config)
        if self.kind == "pair_tied_linear" and config.n_kv_head != config.n_head:
            raise ValueError("qk_scale=pair_tied_linear scales k per query head: it needs n_kv_head == n_head")
        with torch.device("meta"):  # the mask's own range checks, without allocating
            self.mask(config)


@register_variant("qk_scale", QKScaleConfig)  # its record: QKScaleConfig.METHOD
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
