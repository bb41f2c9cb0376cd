"""LeRoPE: learnable RoPE log-frequencies with a reversible custom autograd.

Seed paper 000 §4.2 / Table 2 comparators (§4.2 item 2). Each rotary frequency
theta_c = base^(-2c/D) becomes theta_c * exp(tau_c):

- shared  (`rope=lerope_shared64`, exp31): tau [D/2], one vector for every layer and head,
  FP32 trigonometry (cos/sin stay fp32; the rotated result is cast to x.dtype at the end).
- adapted (`rope=lerope_adapted2048`, exp21): tau [H, D/2], one per layer (owned by the caller),
  BF16 trigonometry exactly like `rotary.rotary_tables` (fp32 angle and cos/sin, rounded to bf16).

Choices: tau starts at 0, so at init LeRoPE is bitwise the baseline RoPE (bf16 trig). Positions
are 0..T-1. The separate frequency-gradient clipping of the original LeRoPE (its §3.1) is omitted,
as in the paper. Angles are fp32 (fp64 only when trig_dtype is float64, for exact verification).

Sign convention (half-split layout of `rotary.py`, x1 = x[..., :D/2], x2 = x[..., D/2:]):
    y1 = x1 cos(phi) + x2 sin(phi),  y2 = x2 cos(phi) - x1 sin(phi),  phi[t, c] = t theta_c e^tau_c
i.e. y = R(phi) x with R = [[c, s], [-s, c]]. Hence
    dL/dx    = R(phi)^T g :  gx1 = g1 c - g2 s,  gx2 = g2 c + g1 s
    dL/dphi  = g1 y2 - g2 y1          (dy1/dphi = y2, dy2/dphi = -y1)
    dL/dtau_c = sum_{b,t,h} (g1 y2 - g2 y1)[..., c] * phi[t, c]     (dphi/dtau = phi)
(adapted: the sum runs over b and t only, per head). The backward therefore needs only the output y
and its cotangent, never x ("reversible": x = R^T y could be rebuilt but is not even needed), so the
autograd graph keeps y plus the small phi table instead of the pre-rotation activation. The tau
reductions are accumulated in fp32 (fp64 on the fp64 path), whatever the activation dtype.

The variant (`lerope`) puts it at the rotary point. "lerope_shared": tau [D/2] for every layer and
head, fp32 trigonometry (close to, not bitwise, the baseline's bf16 tables); "lerope_adapted":
tau [L, H, D/2], bf16 trigonometry (bitwise the baseline at tau = 0). Parameter `rope_tau` and
the non-persistent buffer `inv_freq`; own AdamW group, lr = scalar_lr x lr_mult.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from muonlab.model.extensions import ModelVariant, VariantConfig, register_variant
from muonlab.settings import NON_NEGATIVE, MethodInfo, setting


def inv_frequencies(head_dim: int, base: float = 10000.0,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 [D/2] inverse frequencies, computed with the same ops as `rotary.rotary_tables`."""
    channels = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
    return 1.0 / (base ** (channels / head_dim))


def lerope_angles(seq_len: int, inv_freq: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """phi = t * inv_freq * exp(tau): [T, D/2] for tau [D/2], [T, H, D/2] for tau [H, D/2].

    fp32 (fp64 if an input is fp64). theta is formed first so that at tau = 0 the product
    t * theta is bitwise `torch.outer(positions, inv_freq)` of the baseline tables.
    """
    dtype = torch.promote_types(torch.promote_types(inv_freq.dtype, tau.dtype), torch.float32)
    theta = inv_freq.to(dtype) * tau.to(dtype).exp()
    t = torch.arange(seq_len, dtype=dtype, device=tau.device)
    return t.view(-1, *([1] * theta.ndim)) * theta


def _angles(x: torch.Tensor, tau: torch.Tensor, inv_freq: torch.Tensor,
            trig_dtype: torch.dtype) -> torch.Tensor:
    work = torch.float64 if trig_dtype == torch.float64 else torch.float32
    return lerope_angles(x.shape[1], inv_freq.to(work), tau.to(work))


def _trig(phi: torch.Tensor, trig_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin rounded to trig_dtype, shaped [1, T, 1, D/2] (shared) or [1, T, H, D/2] (adapted)."""
    cos, sin = phi.cos().to(trig_dtype), phi.sin().to(trig_dtype)
    if phi.ndim == 2:
        cos, sin = cos[:, None], sin[:, None]
    return cos[None], sin[None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # For bf16 x and bf16 tables these are exactly the ops of rotary.apply_rotary; with fp32
    # tables the products promote to fp32 and only the result is rounded to x.dtype.
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).to(x.dtype)


class _ReversibleLeRoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tau: torch.Tensor, inv_freq: torch.Tensor,
                trig_dtype: torch.dtype) -> torch.Tensor:
        phi = _angles(x, tau, inv_freq, trig_dtype)
        y = _rotate(x, *_trig(phi, trig_dtype))
        ctx.save_for_backward(y, phi)  # never x: that is the memory saving
        ctx.trig_dtype, ctx.tau_dtype = trig_dtype, tau.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        y, phi = ctx.saved_tensors
        half = y.shape[-1] // 2
        g1, g2 = g[..., :half], g[..., half:]
        grad_x = grad_tau = None
        if ctx.needs_input_grad[0]:
            cos, sin = _trig(phi, ctx.trig_dtype)  # recomputed: cheaper than saving [T, D/2] twice
            grad_x = torch.cat([g1 * cos - g2 * sin, g2 * cos + g1 * sin], dim=-1).to(y.dtype)
        if ctx.needs_input_grad[1]:
            acc = phi.dtype  # fp32 (fp64 on the fp64 path) even for bf16 activations
            dphi = g1.to(acc) * y[..., half:].to(acc) - g2.to(acc) * y[..., :half].to(acc)
            # phi depends on (t, c) or (t, h, c) only: reduce b (and h) before weighting by phi.
            dphi = dphi.sum(dim=(0, 2)) if phi.ndim == 2 else dphi.sum(dim=0)
            grad_tau = (dphi * phi).sum(dim=0).to(ctx.tau_dtype)
        return grad_x, grad_tau, None, None


def apply_lerope(x: torch.Tensor, tau: torch.Tensor, inv_freq: torch.Tensor,
                 trig_dtype: torch.dtype, reversible: bool = True) -> torch.Tensor:
    """Rotate x [B, T, H, D] at positions 0..T-1 by frequencies inv_freq * exp(tau).

    tau: [D/2] (shared) or [H, D/2] (adapted). reversible=False runs plain autograd through the
    same forward ops (bitwise-equal output) and is kept for verification.
    """
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be [B, T, H, D] with even D, got {tuple(x.shape)}")
    half, heads = x.shape[-1] // 2, x.shape[2]
    if tuple(tau.shape) not in ((half,), (heads, half)) or tuple(inv_freq.shape) != (half,):
        raise ValueError(f"tau {tuple(tau.shape)} / inv_freq {tuple(inv_freq.shape)} do not fit "
                         f"x {tuple(x.shape)}: expected tau [{half}] or [{heads}, {half}]")
    if reversible:
        return _ReversibleLeRoPE.apply(x, tau, inv_freq, trig_dtype)
    return _rotate(x, *_trig(_angles(x, tau, inv_freq, trig_dtype), trig_dtype))


VARIANTS: dict[str, torch.dtype] = {"shared": torch.float32, "adapted": torch.bfloat16}


def lerope_grad_agreement(B: int, T: int, H: int, D: int, variant: str, seed: int,
                          x_dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Custom (reversible) vs plain autograd on random x, cotangent and tau ~ 0.1 N(0, 1).

    variant "shared" uses tau [D/2] and fp32 trig, "adapted" tau [H, D/2] and bf16 trig; x is bf16
    by default, as the model's q/k activations are. Paper 000 reports forward diff 0.0 and
    tau-gradient cosine 0.9999978 (shared) / 0.9999841 (adapted) at T=2048.
    """
    trig = VARIANTS[variant]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, D, generator=gen).to(x_dtype)
    g = torch.randn(B, T, H, D, generator=gen).to(x_dtype)
    tau0 = 0.1 * torch.randn((D // 2,) if variant == "shared" else (H, D // 2), generator=gen)
    inv_freq = inv_frequencies(D)
    runs = []
    for reversible in (True, False):
        xi, ti = x.clone().requires_grad_(), tau0.clone().requires_grad_()
        y = apply_lerope(xi, ti, inv_freq, trig, reversible=reversible)
        y.backward(g)
        runs.append((y.detach().double(), xi.grad.double(), ti.grad.double()))
    (y_c, gx_c, gt_c), (y_p, gx_p, gt_p) = runs
    return {
        "forward_max_abs_diff": (y_c - y_p).abs().max().item(),
        "tau_grad_cosine": torch.nn.functional.cosine_similarity(gt_c.flatten(), gt_p.flatten(),
                                                                 dim=0).item(),
        "tau_grad_rel_l2": ((gt_c - gt_p).norm() / gt_p.norm()).item(),
        "x_grad_rel_l2": ((gx_c - gx_p).norm() / gx_p.norm()).item(),
    }


KINDS = ("lerope_shared", "lerope_adapted")


@dataclass(frozen=True)
class LeRoPEConfig(VariantConfig):
    """Seed 000 Table 2: learnable RoPE log-frequencies (LeRoPE). The run config's `model.rope`
    section and the configuration LeRoPE reads."""

    METHOD: ClassVar[MethodInfo] = MethodInfo('lerope', 'seed 000 §4.2, Table 2 (§4.2 item 2)', __name__,
                                              ('tests/model/test_lerope.py', 'tests/model/test_model_variants.py'), 'kind', 'standard')

    kind: Literal["standard", "lerope_shared", "lerope_adapted"] = setting(
        "standard", "standard RoPE, LeRoPE shared (64, fp32 trig) or adapted (per layer and head, bf16 trig)", flag="rope")
    lr_mult: float = setting(0.04, "LeRoPE's AdamW lr as a multiple of scalar_lr", flag="rope-lr-mult",
                             range=NON_NEGATIVE)


@register_variant("lerope", LeRoPEConfig)  # its record: LeRoPEConfig.METHOD
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
