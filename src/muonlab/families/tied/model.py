"""Tied-token NanoGPT (and its MoE variant) of seed 004, AF-Muon (App. J.1, J.6).

Architecture (seed 004 App. J.1 / J.6 for the shapes; the "shared model conventions" of
the released code, not in the paper, for the rest):
  - token table `wte` E in R^{V x d} that IS the LM-head weight (E_in = W_out^T): one
    stored Parameter, so autograd merges the sparse lookup and the dense softmax
    gradients on it (seed 004 §2.2 "Tied table (aliased)", App. D.1). The head owns no
    Parameter of its own (`TiedLMHead`), so the tie survives `.to()`, `to_empty()`,
    `load_state_dict` and `deepcopy`, and `state_dict` holds the table once (`wte.weight`);
  - pre-norm blocks: RMSNorm with a learnable gain (eps 1e-6, gains are the 1-D tensors
    AF-Muon updates with its RMS-LMO), fused bias-free QKV `Linear(d, 3d)`, RoPE (base
    10,000, interleaved pairs (2i, 2i+1)), causal SDPA, bias-free out-projection;
  - MLP `Linear(d, r*d) -> ScaledReLU^2 -> Linear(r*d, d)`, ScaledReLU^2(x) = sqrt(2) *
    ReLU(x)^2 (the released code's `scaled_relu_sq`, default on for all arms);
  - MoE variant: the MLP replaced by `muonlab.families.tied.moe.TopKMoE` (4 experts, top-1);
  - final RMSNorm, logits = h E^T, no soft-cap, no QK-norm, no biases, no positional
    table (the V2 partition rejects one), dropout 0;
  - init: N(0, 0.02) for every Linear and for the table, gains 1 (released code).

Shapes: NanoGPT has "12 layers, 6 attention heads, head dimension 128, hidden size 768,
MLP hidden size 3072, and a 50,304-token vocabulary" (App. J.1): 123,587,328 parameters
with the table counted once; the MoE variant has 293,493,504 (derived from App. J.1, J.6 shapes; not printed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.errors import UsageError
from muonlab.families.tied.moe import TopKMoE, at_least_fp32, router_stats

REDUCTIONS = ("mean", "sum", "none")
GRAD_SOURCES = ("both", "lookup", "softmax")


@dataclass(frozen=True)
class TiedGPTConfig:
    """Shape and settings of a tied NanoGPT; defaults are seed 004's NanoGPT-124M."""

    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6  # seed 004 App. J.1: 6 heads x head dim 128
    n_embd: int = 768
    sequence_len: int = 1024  # RoPE table length = longest sequence accepted
    mlp_ratio: int = 4  # MLP hidden 3072 = 4 x 768
    moe: bool = False
    n_experts: int = 4  # App. J.6: four experts per layer
    top_k: int = 1  # App. J.6: top-1 routing
    aux_loss_coef: float = 0.01  # App. J.6: load-balancing coefficient (z-loss is 0)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    act_scale: float = math.sqrt(2.0)  # ScaledReLU^2; 1.0 gives plain ReLU^2
    # seed 004 K.8 gradient-source intervention: which path's gradient reaches the tied table
    # ("both": the merged gradient; "lookup": input-only, the head uses a detached table;
    # "softmax": output-only, the lookup reads a detached table)
    grad_source: str = "both"

    def __post_init__(self) -> None:
        if self.grad_source not in GRAD_SOURCES:
            raise ValueError(f"grad_source must be one of {GRAD_SOURCES}, got {self.grad_source!r}")
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "sequence_len", "mlp_ratio",
                     "n_experts", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        if self.aux_loss_coef < 0 or self.norm_eps <= 0 or self.init_std < 0:
            raise ValueError("aux_loss_coef and init_std must be >= 0 and norm_eps > 0")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_ratio * self.n_embd


def expected_num_parameters(cfg: TiedGPTConfig) -> int:
    """Closed-form count, tied table once: V d + d + L (4 d^2 + 2 d + MLP), where the MLP
    is 2 d h (dense) or E (2 d h) + d E (MoE: experts + router), h = mlp_ratio * d."""
    d, h = cfg.n_embd, cfg.mlp_hidden
    mlp = cfg.n_experts * 2 * d * h + d * cfg.n_experts if cfg.moe else 2 * d * h
    return cfg.vocab_size * d + d + cfg.n_layer * (4 * d * d + 2 * d + mlp)


def scaled_relu_sq(x: torch.Tensor, scale: float = math.sqrt(2.0)) -> torch.Tensor:
    """ScaledReLU^2(x) = scale * ReLU(x)^2, scale sqrt(2) in every seed-004 arm."""
    return F.relu(x).square() * scale


def rotary_tables(seq_len: int, head_dim: int, base: float,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), fp32 [seq_len, head_dim // 2]: pair i turns by angle t * base^(-2i/D)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x_2i, x_2i+1) of x [..., T, D] by the tables [T, D/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g, normalised in fp32 (float64 stays float64), learnable gain g (init 1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if x.dtype == torch.float64 else x.float()
        normed = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class CausalSelfAttention(nn.Module):
    """Fused bias-free QKV, RoPE on q and k, causal SDPA (scale 1/sqrt(D)), out-projection."""

    def __init__(self, cfg: TiedGPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """Bias-free `fc` (d -> h), ScaledReLU^2, `proj` (h -> d); also one MoE expert."""

    def __init__(self, n_embd: int, hidden: int, act_scale: float):
        super().__init__()
        self.act_scale = act_scale
        self.fc = nn.Linear(n_embd, hidden, bias=False)
        self.proj = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(scaled_relu_sq(self.fc(x), self.act_scale))


class Block(nn.Module):
    """Pre-norm block; forward returns (x, aux), aux the MoE balance loss or None."""

    def __init__(self, cfg: TiedGPTConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        make = lambda: MLP(cfg.n_embd, cfg.mlp_hidden, cfg.act_scale)  # noqa: E731
        self.mlp = (TopKMoE(cfg.n_embd, cfg.n_experts, cfg.top_k, cfg.aux_loss_coef, make)
                    if cfg.moe else make())

    def forward(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.attn(self.norm1(x), cos, sin)
        if isinstance(self.mlp, TopKMoE):
            y, aux = self.mlp(self.norm2(x))
            return x + y, aux
        return x + self.mlp(self.norm2(x)), None


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    """Cross-entropy in at least fp32, ignore_index -1; "none" keeps the targets' shape."""
    loss = F.cross_entropy(at_least_fp32(logits).reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=-1, reduction=reduction)
    return loss.view_as(targets) if reduction == "none" else loss


class TiedLMHead(nn.Module):
    """Output embedding whose `.weight` is the input table itself (no Parameter of its own).

    The embedding is held outside the module tree, so the table is registered, saved and
    converted once, through `wte`, while `weight` always returns that same Parameter.
    """

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        object.__setattr__(self, "_embedding", embedding)

    @property
    def weight(self) -> nn.Parameter:
        return self._embedding.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.weight)

    def extra_repr(self) -> str:
        return f"tied to the input embedding, weight {tuple(self.weight.shape)}"


class TiedGPT(nn.Module):
    """Seed 004's tied NanoGPT / NanoGPT-MoE; `forward(idx, targets=None)` -> logits or loss.

    After a forward pass, `aux_loss` holds the detached MoE load-balancing loss summed over
    layers (None for the dense model) and `lm_loss` the detached LM loss (None without
    targets), for logging.
    """

    def __init__(self, config: TiedGPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.lm_head = TiedLMHead(self.wte)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        cos, sin = rotary_tables(config.sequence_len, config.head_dim, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.aux_loss: torch.Tensor | None = None
        self.lm_loss: torch.Tensor | None = None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) for the table and every Linear, gains 1, RoPE tables rebuilt
        (also materialises a model built on the meta device after `to_empty`)."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        cos, sin = rotary_tables(self.config.sequence_len, self.config.head_dim,
                                 self.config.rope_base, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def get_output_embeddings(self) -> TiedLMHead:
        return self.lm_head

    def num_parameters(self) -> int:
        """Unique stored parameters: the tied table counts once."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def num_scaling_params(self) -> dict[str, int]:
        """The lab's parameter breakdown (the tied table once)."""
        table = self.wte.weight.numel()
        vectors = sum(p.numel() for p in self.parameters() if p.ndim <= 1)
        counts = {"tied_table": table, "matrices": self.num_parameters() - table - vectors, "vectors": vectors}
        counts["total"] = sum(counts.values())
        return counts

    def estimate_flops(self) -> int:
        """FLOPs per token, forward + backward: 6 x the matrix parameters a token touches (the tied
        table once, as the head's matmul; top-1 MoE: one expert's MLP) + causal attention 12 L d T."""
        c = self.config
        matrices = sum(p.numel() for n, p in self.named_parameters() if p.ndim >= 2 and "experts" not in n)
        if c.moe:
            matrices += c.n_layer * 2 * c.n_embd * c.mlp_hidden * c.top_k
        return 6 * matrices + 12 * c.n_layer * c.n_embd * c.sequence_len

    def backbone(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Embedded tokens [B, T, d] -> (final-normed hidden states, summed aux or None)."""
        T = x.size(1)
        if T > self.config.sequence_len:
            raise ValueError(f"sequence length {T} exceeds sequence_len={self.config.sequence_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        aux_total: torch.Tensor | None = None
        for block in self.blocks:
            x, aux = block(x, cos, sin)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        return self.norm(x), aux_total

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean", include_aux: bool | None = None) -> torch.Tensor:
        """Logits [B, T, V] without targets; with targets the cross-entropy (ignore_index
        -1) plus, when `include_aux` (default: `self.training`), the MoE balance loss.

        Seed 004 App. J.6: the aux loss is part of the training loss; evaluation uses the
        LM loss only. The aux loss is a batch scalar, so it combines only with "mean".
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        table = self.wte.weight
        source = self.config.grad_source
        h, aux = self.backbone(F.embedding(idx, table.detach()) if source == "softmax" else self.wte(idx))
        self.aux_loss = None if aux is None else aux.detach()
        logits = F.linear(h, table.detach()) if source == "lookup" else self.lm_head(h)
        if targets is None:
            self.lm_loss = None
            return logits
        loss = lm_loss(logits, targets, reduction)
        self.lm_loss = loss.detach()
        use_aux = self.training if include_aux is None else include_aux
        if aux is None or not use_aux:
            return loss
        if reduction != "mean":
            raise ValueError("the MoE aux loss combines only with reduction='mean'; "
                             "pass include_aux=False for per-token or summed losses")
        return loss + aux

    def router_stats(self) -> dict[str, float]:
        """Seed 004 Table 19 diagnostics averaged over MoE layers ({} for the dense model)."""
        stats = [router_stats(b.mlp.last_counts) for b in self.blocks
                 if isinstance(b.mlp, TopKMoE) and b.mlp.last_counts is not None]
        return {k: sum(s[k] for s in stats) / len(stats) for k in stats[0]} if stats else {}


TIED_SHAPES: dict[str, TiedGPTConfig] = {
    # tests and demos: seconds on a CPU
    "tied-tiny": TiedGPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=64, sequence_len=64),
    "tied-tiny-moe": TiedGPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=64, sequence_len=64,
                                   moe=True),
    # CPU demo at the autoresearch family's 4 x 256 CPU benchmark shape (T 256, vocab 2048), head dim 128
    "tied-cpu": TiedGPTConfig(vocab_size=2048, n_layer=4, n_head=2, n_embd=256, sequence_len=256),
    "tied-cpu-moe": TiedGPTConfig(vocab_size=2048, n_layer=4, n_head=2, n_embd=256,
                                  sequence_len=256, moe=True),
    # seed 004 App. J.1 / J.6 (T 1024)
    "nanogpt-124m": TiedGPTConfig(),
    "nanogpt-124m-moe": TiedGPTConfig(moe=True),
}


def build_tied_model(spec: str | TiedGPTConfig, **overrides: object) -> TiedGPT:
    """Build a `TiedGPT` from a preset name or a config, with optional field overrides.

    Builds on the current default device, so `with torch.device("meta"):` gives a
    shape-only model (materialise with `to_empty(device=...)` then `init_weights()`).
    """
    return TiedGPT(shape_config(spec, TIED_SHAPES, "tied preset", **overrides))


def shape_config(spec, shapes: dict, what: str, **overrides: object):
    """The config a model builder reads: the shape `spec` names in `shapes` (UsageError naming `what`
    otherwise) or the config given, with field overrides (the tied, T5 and ImageGPT builders)."""
    if isinstance(spec, str):
        if spec not in shapes:
            raise UsageError(f"unknown {what} {spec!r}; choose from {', '.join(shapes)}")
        spec = shapes[spec]
    return replace(spec, **overrides) if overrides else spec
