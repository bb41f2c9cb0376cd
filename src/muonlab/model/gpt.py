"""The autoresearch GPT (karpathy/autoresearch train.py @ 228791f), same API and parameter names.

Per block: x <- resid_lambda * x + x0_lambda * x0 (x0 = normed token embedding), then
pre-norm attention and a ReLU^2 MLP, all linears bias-free, norms weightless RMSNorm.
Attention: RoPE then QK RMSNorm, ResFormer value embeddings on alternating layers (the
last always included) mixed into v with a per-head gate 2*sigmoid(W x[:32]), and a
sliding-window pattern ("S" = half context, "L" = full, last layer always full).
Logits are soft-capped at 15 and computed in fp32; with targets, the loss is by default the fused,
chunked form of the same computation (muonlab.model.head_loss; `head_loss="reference"`: upstream's ops).

Model variants (`config.variants`) attach at the extension points of
muonlab.model.extensions: each `self.points.<hook>` is None unless a variant defines it,
fixed at build time, so the baseline runs upstream's ops (the fused loss aside) with no dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.model import extensions
from muonlab.model.attention import causal_attention, resolve_backend
from muonlab.model.head_loss import softcapped_cross_entropy
from muonlab.model.rotary import apply_rotary, rotary_tables

LOGIT_SOFTCAP = 15.0
HEAD_LOSSES = ("fused", "reference")
VE_GATE_CHANNELS = 32


@dataclass
class GPTConfig:
    sequence_len: int = 2048
    vocab_size: int = 32768
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 6
    n_embd: int = 768
    window_pattern: str = "SSSL"
    attn_backend: str = "auto"  # muonlab: "auto" | "fa3" | "flex" | "sdpa" (the same windows on each)
    head_loss: str = "fused"  # muonlab: "fused" (muonlab.model.head_loss) | "reference" (upstream's ops)
    variants: tuple = ()  # muonlab: configs of registered model variants (muonlab.model.extensions)

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_kv_head > self.n_head or self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")
        if not self.window_pattern or any(c not in "SL" for c in self.window_pattern.upper()):
            raise ValueError(f"window_pattern must use only 'S' and 'L', got {self.window_pattern!r}")
        if self.head_loss not in HEAD_LOSSES:
            raise ValueError(f"head_loss must be one of {HEAD_LOSSES}, got {self.head_loss!r}")
        self.variants = tuple(self.variants)
        extensions.check_variants(self)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def norm(x: torch.Tensor) -> torch.Tensor:
    """Weightless RMSNorm over the last dimension (eps: PyTorch's default)."""
    return F.rms_norm(x, (x.size(-1),))


def has_ve(layer_idx: int, n_layer: int) -> bool:
    """Value embeddings on alternating layers, the last layer always included."""
    return layer_idx % 2 == (n_layer - 1) % 2


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int, points: extensions.ExtensionPoints):
        super().__init__()
        self.layer_idx, self.points = layer_idx, points
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        d = config.n_embd
        self.c_q = nn.Linear(d, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ve_gate_channels = VE_GATE_CHANNELS
        self.ve_gate = (nn.Linear(VE_GATE_CHANNELS, self.n_kv_head, bias=False)
                        if has_ve(layer_idx, config.n_layer) else None)
        self.backend = "sdpa"  # set by GPT.resolve_attention_backend()
        self.flash_attn_func = None  # the FA3 kernel's function when backend is "fa3"

    def forward(self, x, ve, cos_sin, window_size):
        B, T, _ = x.size()
        p, i = self.points, self.layer_idx
        if p.attn_input is None:
            q, k, v, gate_in = self.c_q(x), self.c_k(x), self.c_v(x), x[..., :self.ve_gate_channels]
        else:  # sublayer input
            q, k, v, gate_in = p.attn_input(i, self, x)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            # ResFormer value residual: gate in (0, 2), exactly 1 at zero init
            ve = ve.view(B, T, self.n_kv_head, self.head_dim)
            gate = 2 * torch.sigmoid(self.ve_gate(gate_in))
            v = v + gate.unsqueeze(-1) * ve
        if p.rotary is None:
            cos, sin = cos_sin
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        else:
            q, k = p.rotary(i, q, k, cos_sin)
        q, k = norm(q), norm(k)  # QK-norm after RoPE, as upstream
        if p.qk is not None:  # post-QK-norm
            q, k = p.qk(i, q, k)
        y = causal_attention(q, k, v, window_size, self.backend, self.flash_attn_func)
        return self.c_proj(y.contiguous().view(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int, points: extensions.ExtensionPoints):
        super().__init__()
        self.layer_idx, self.points = layer_idx, points
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        mlp_input = self.points.mlp_input
        h = self.c_fc(x) if mlp_input is None else mlp_input(self.layer_idx, self, x)
        return self.c_proj(F.relu(h).square())


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int, points: extensions.ExtensionPoints):
        super().__init__()
        self.layer_idx, self.points = layer_idx, points
        self.attn = CausalSelfAttention(config, layer_idx, points)
        self.mlp = MLP(config, layer_idx, points)

    def forward(self, x, ve, cos_sin, window_size):
        x = self._add(0, x, self.attn(norm(x), ve, cos_sin, window_size))
        return self._add(1, x, self.mlp(norm(x)))

    def _add(self, slot: int, u, f):
        """The residual addition u + f (slot 0: attention, 1: MLP) at the residual point."""
        p = self.points
        if p.branch is not None:
            f = p.branch(self.layer_idx, slot, u, f)
        return u + f if p.residual_add is None else p.residual_add(u, f)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.window_sizes = self._compute_window_sizes(config)
        self.variants = tuple(extensions.build_variants(config))
        self.points = extensions.wire(list(self.variants))
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "h": nn.ModuleList([Block(config, i, self.points) for i in range(config.n_layer)]),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
        self.x0_lambdas = nn.Parameter(torch.zeros(config.n_layer))
        kv_dim = config.n_kv_head * config.head_dim
        self.value_embeds = nn.ModuleDict({
            str(i): nn.Embedding(config.vocab_size, kv_dim)
            for i in range(config.n_layer) if has_ve(i, config.n_layer)
        })
        # RoPE tables cover 10x the training context, as upstream
        self.rotary_seq_len = config.sequence_len * 10
        cos, sin = rotary_tables(self.rotary_seq_len, config.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for variant in self.variants:  # their parameters live here, outside transformer.h
            variant.bind(self)

    @staticmethod
    def _compute_window_sizes(config: GPTConfig) -> list[tuple[int, int]]:
        """(left, right) per layer; 'L' = full context, 'S' = half; the last layer is full."""
        pattern = config.window_pattern.upper()
        long_window, short_window = config.sequence_len, config.sequence_len // 2
        sizes = [(long_window if pattern[i % len(pattern)] == "L" else short_window, 0)
                 for i in range(config.n_layer)]
        sizes[-1] = (long_window, 0)
        return sizes

    def resolve_attention_backend(self) -> str:
        """Choose FA3, FlexAttention or SDPA for the device the model lives on; returns the choice. Each layer
        keeps the kernel's function itself: forward never looks it up (a graph break per layer)."""
        backend = resolve_backend(self.config.attn_backend, self.lm_head.weight.device)
        for block in self.transformer.h:
            block.attn.backend, block.attn.flash_attn_func = backend.name, backend.flash_attn_func
        return backend.name

    @torch.no_grad()
    def init_weights(self):
        torch.nn.init.normal_(self.transformer.wte.weight, mean=0.0, std=1.0)
        torch.nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.001)
        # uniform with the std of N(0, 1/d): bound sqrt(3/d)
        s = 3**0.5 * self.config.n_embd**-0.5
        for block in self.transformer.h:
            torch.nn.init.uniform_(block.attn.c_q.weight, -s, s)
            torch.nn.init.uniform_(block.attn.c_k.weight, -s, s)
            torch.nn.init.uniform_(block.attn.c_v.weight, -s, s)
            torch.nn.init.zeros_(block.attn.c_proj.weight)
            torch.nn.init.uniform_(block.mlp.c_fc.weight, -s, s)
            torch.nn.init.zeros_(block.mlp.c_proj.weight)
        self.resid_lambdas.fill_(1.0)
        self.x0_lambdas.fill_(0.1)
        for ve in self.value_embeds.values():
            torch.nn.init.uniform_(ve.weight, -s, s)
        for variant in self.variants:  # neutral, and without RNG draws: seeds stay paired
            variant.init_weights()
        for block in self.transformer.h:
            if block.attn.ve_gate is not None:
                torch.nn.init.zeros_(block.attn.ve_gate.weight)  # gate = 2*sigmoid(0) = 1
        self.cos, self.sin = rotary_tables(self.rotary_seq_len, self.config.head_dim,
                                           device=self.transformer.wte.weight.device)
        # upstream keeps the embedding tables in bf16 (autocast does not touch embeddings)
        self.transformer.wte.to(dtype=torch.bfloat16)
        for ve in self.value_embeds.values():
            ve.to(dtype=torch.bfloat16)

    def estimate_flops(self) -> int:
        """Estimated FLOPs per token (forward + backward): 6 N (matmul params) + attention."""
        nparams = sum(p.numel() for p in self.parameters())
        value_embeds = sum(ve.weight.numel() for ve in self.value_embeds.values())
        excluded = (self.transformer.wte.weight.numel() + value_embeds
                    + self.resid_lambdas.numel() + self.x0_lambdas.numel()
                    + sum(v.flop_excluded() for v in self.variants))
        h, q, t = self.config.n_head, self.config.head_dim, self.config.sequence_len
        attn_flops = sum(12 * h * q * (t if w < 0 else min(w, t)) for w, _ in self.window_sizes)
        return 6 * (nparams - excluded) + attn_flops

    def num_scaling_params(self) -> dict[str, int]:
        counts = {
            "wte": sum(p.numel() for p in self.transformer.wte.parameters()),
            "value_embeds": sum(p.numel() for p in self.value_embeds.parameters()),
            "lm_head": sum(p.numel() for p in self.lm_head.parameters()),
            "transformer_matrices": sum(p.numel() for p in self.transformer.h.parameters()),
            "scalars": self.resid_lambdas.numel() + self.x0_lambdas.numel(),
        }
        for variant in self.variants:
            counts.update(variant.param_counts())
        counts["total"] = sum(counts.values())
        for variant in self.variants:
            counts.update(variant.counts_apart(counts["total"]))
        return counts

    def summary_counts(self) -> dict[str, float]:
        """What the variants report in the run summary from the parameter counts."""
        counts = self.num_scaling_params()
        return {k: v for variant in self.variants for k, v in variant.summary_counts(counts).items()}

    def param_groups(self, unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02, weight_decay=0.0,
                     adam_betas=(0.8, 0.95), scalar_lr=0.5) -> list[tuple[str, dict]]:
        """Upstream's optimizer groups, each with its name, in upstream's order: "lm_head", "wte",
        "value_embeds", "resid_lambdas", "x0_lambdas" (AdamW, LRs scaled by (d/768)^-1/2, tuned at
        d=768), then each variant's own groups (named by the variant, in registry order), then one
        "muon" group per block-matrix shape (same-shape matrices are stacked in one step). A
        family adds its methods' keys to the groups it names (muonlab.families.autoresearch)."""
        lrs = extensions.LRs(unembedding_lr, embedding_lr, matrix_lr, scalar_lr, tuple(adam_betas),
                             (self.config.n_embd / 768) ** -0.5)
        named = [
            ("lm_head", lrs.adamw(list(self.lm_head.parameters()), unembedding_lr * lrs.dim_scale)),
            ("wte", lrs.adamw(list(self.transformer.wte.parameters()), embedding_lr * lrs.dim_scale)),
            ("value_embeds", lrs.adamw(list(self.value_embeds.parameters()), embedding_lr * lrs.dim_scale)),
            ("resid_lambdas", lrs.adamw([self.resid_lambdas], scalar_lr * 0.01)),
            ("x0_lambdas", lrs.adamw([self.x0_lambdas], scalar_lr, betas=(0.96, 0.95))),
        ]
        for variant in self.variants:
            named += [(variant.name, group) for group in variant.param_groups(lrs)]
        matrix_params = self.block_matrices()
        for shape in sorted({p.shape for p in matrix_params}):
            named.append(("muon", dict(kind="muon", params=[p for p in matrix_params if p.shape == shape],
                                       lr=matrix_lr, momentum=0.95, ns_steps=5, beta2=0.95, weight_decay=weight_decay)))
        if sum(len(g["params"]) for _, g in named) != len(list(self.parameters())):
            raise RuntimeError("param_groups: some parameters belong to no optimizer group")
        return named

    def block_matrices(self) -> list[nn.Parameter]:
        """The transformer blocks' parameters (the Muon matrices), in module order."""
        return list(self.transformer.h.parameters())

    def setup_optimizer(self, unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02,
                        weight_decay=0.0, adam_betas=(0.8, 0.95), scalar_lr=0.5, **optimizer_kwargs):
        """MuonAdamW over upstream's groups (param_groups), as upstream's setup_optimizer."""
        from muonlab.optim import MuonAdamW

        groups = self.param_groups(unembedding_lr, embedding_lr, matrix_lr, weight_decay, adam_betas, scalar_lr)
        return self.attach_optimizer(MuonAdamW([group for _, group in groups], **optimizer_kwargs))

    def attach_optimizer(self, optimizer):
        """Wire each variant's optimizer-side state (`attach`, e.g. visit counts) and record every
        group's `initial_lr` (the schedule scales from it); returns the optimizer."""
        for variant in self.variants:
            variant.attach(optimizer)
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer

    def forward(self, idx, targets=None, reduction="mean"):
        B, T = idx.size()
        if T > self.cos.size(1):
            raise ValueError(f"sequence length {T} exceeds the RoPE table ({self.cos.size(1)})")
        p = self.points
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        w = self.transformer.wte(idx)
        e = None if p.embed is None else p.embed(idx)  # token embedding
        x = norm(w) if e is None else norm(w + e)
        x0 = x
        s = None if p.stream is None else p.stream(w, e)
        for i, block in enumerate(self.transformer.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            if s is not None:
                x = p.block_input(i, x, s)
            key = str(i)
            ve = self.value_embeds[key](idx) if key in self.value_embeds else None
            if p.run_block is None:
                x = block(x, ve, cos_sin, self.window_sizes[i])
            else:  # block execution
                x = p.run_block(block, x, ve, cos_sin, self.window_sizes[i])
        if s is not None:
            x = p.head_input(x, x0, s)
        x = norm(x)
        if targets is not None and p.loss is not None:
            return p.loss(x, targets, reduction)
        if targets is not None and self.config.head_loss == "fused":
            # the same loss without the [B*T, V] fp32 logits and their gradient in memory
            return softcapped_cross_entropy(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1),
                                            LOGIT_SOFTCAP, reduction)
        logits = self._logits(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1, reduction=reduction)

    def _logits(self, x):
        logits = self.lm_head(x).float()
        return LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
