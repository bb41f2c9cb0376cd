"""Learned scalar scalings of seed 000: pre-sublayer channel gains and post-QK-norm scaling.

Pre-sublayer gains (seed 000 §3.1, spec-000-003 §1.A): per layer a_attn, a_mlp in R^d scale
the pre-norm output x_hat = norm(x) on the inputs of W_Q, W_K, W_V and of W_fc; the ResFormer
value-embedding gate keeps reading the UNSCALED x_hat[..., :32]. Implementations
(`presub_gains`), the first three exact (equal up to fp32 rounding):
  - "unfused_slice":  xs = x_hat * a; q, k, v = c_q(xs), ...; gate reads the slice view
    x_hat[..., :32] (its storage is the whole x_hat, which backward then keeps alive);
  - "unfused_contig": the same, the gate reads x_hat[..., :32].contiguous() (a compact copy);
  - "weight_fused":   q = F.linear(x_hat, W_Q * a[None, :]) etc. (scales W's input columns);
  - "gate_scaled":    NOT equivalent: the gate reads the scaled slice (x_hat * a)[..., :32].
    The paper does not describe it (spec §1.A [I]); this is one of the two readings it offers.
Parameterisation (`presub_param`): "linear" (a used directly, init 1) or "stopexp" (a =
stop_exp(beta), init beta = 0); the paper does not state which the stop-exp arms used for
their gains (spec §5): "linear" is the default.

Post-QK-norm scaling (seed 000 §3.2, spec §1.B), after q, k = norm(q), norm(k), before
attention, on the half-split RoPE layout where plane c = channels (c, c + D/2):
  - "pair_tied_linear":  s [L, H, D/2], init 1; q, k <- q * [s, s], k * [s, s] (both: metric s^2);
  - "pair_tied_stopexp": tau [L, H, D/2], init 0; q <- q * [m, m], m = stop_exp(tau) (q only);
  - "pair_tied_exp":     as above with a plain exp (seed 002's q_tau, spec-002 §1.5);
  - "untied_stopexp":    tau [L, H, D], q <- q * stop_exp(tau) (nGPT-like, planes not tied);
  - "head_temp":         tau [L, H], q <- q * exp(tau) per head (exp not stopped: unstated).
Proposition 1 (seed 000): pair tying is necessary and sufficient for unit-shift invariance
of the logits (see muonlab.diagnostics.equivalence). A freeze mask (`qk_freeze_layers`,
`qk_freeze_planes`, seed 002's QMASK) multiplies tau by a fixed 0/1 mask (q_eff = tau * M),
so frozen entries stay at scale 1 and get zero gradient.
dtype (unstated): the scale is cast to q's dtype before the product (FA3 needs bf16 q).
"""

from __future__ import annotations

import torch

PRESUB_GAINS = ("none", "unfused_slice", "unfused_contig", "weight_fused", "gate_scaled")
PRESUB_PARAMS = ("linear", "stopexp")
QK_SCALES = ("none", "pair_tied_linear", "pair_tied_stopexp", "pair_tied_exp", "untied_stopexp", "head_temp")


def stop_exp(tau: torch.Tensor) -> torch.Tensor:
    """exp(sg(tau)) + tau - sg(tau): forward value e^tau, backward Jacobian 1 (seed 000 §3.2)."""
    return tau.exp().detach() + tau - tau.detach()


# ---------------------------------------------------------------- pre-sublayer gains

def gain_init(param: str) -> float:
    """Initial raw value: 1 for linear, 0 for stopexp (both give a gain of exactly 1)."""
    return 1.0 if param == "linear" else 0.0


def gain_value(raw: torch.Tensor, param: str) -> torch.Tensor:
    return raw if param == "linear" else stop_exp(raw)


# ---------------------------------------------------------------- post-QK-norm scaling

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
