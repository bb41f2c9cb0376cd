"""The autoresearch GPT (karpathy/autoresearch train.py @ 228791f), same API and parameter names.

Per block: x <- resid_lambda * x + x0_lambda * x0 (x0 = normed token embedding), then
pre-norm attention and a ReLU^2 MLP, all linears bias-free, norms weightless RMSNorm.
Attention: RoPE then QK RMSNorm, ResFormer value embeddings on alternating layers (the
last always included) mixed into v with a per-head gate 2*sigmoid(W x[:32]), and a
sliding-window pattern ("S" = half context, "L" = full, last layer always full).
Logits are soft-capped at 15 and computed in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.model.attention import causal_attention, resolve_backend
from muonlab.model.rotary import apply_rotary, rotary_tables

LOGIT_SOFTCAP = 15.0
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
    attn_backend: str = "auto"  # muonlab: "auto" | "fa3" | "sdpa" (same windows either way)

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_kv_head > self.n_head or self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")
        if not self.window_pattern or any(c not in "SL" for c in self.window_pattern.upper()):
            raise ValueError(f"window_pattern must use only 'S' and 'L', got {self.window_pattern!r}")

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
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
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

    def forward(self, x, ve, cos_sin, window_size):
        B, T, _ = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            # ResFormer value residual: gate in (0, 2), exactly 1 at zero init
            ve = ve.view(B, T, self.n_kv_head, self.head_dim)
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve
        cos, sin = cos_sin
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q), norm(k)  # QK-norm after RoPE, as upstream
        y = causal_attention(q, k, v, window_size, self.backend)
        return self.c_proj(y.contiguous().view(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos_sin, window_size):
        x = x + self.attn(norm(x), ve, cos_sin, window_size)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.window_sizes = self._compute_window_sizes(config)
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "h": nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
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
        """Choose FA3 or SDPA for the device the model lives on; returns the choice."""
        backend = resolve_backend(self.config.attn_backend, self.lm_head.weight.device)
        for block in self.transformer.h:
            block.attn.backend = backend
        return backend

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
                    + self.resid_lambdas.numel() + self.x0_lambdas.numel())
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
        counts["total"] = sum(counts.values())
        return counts

    def setup_optimizer(self, unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02,
                        weight_decay=0.0, adam_betas=(0.8, 0.95), scalar_lr=0.5,
                        matrix_optimizer="muon", adamw_matrix_lr=0.003, adamw_matrix_weight_decay=0.0,
                        optimizer_cls=None, muon_options=None, whiten_options=None, master32=False,
                        **optimizer_kwargs):
        """MuonAdamW with upstream's groups; AdamW LRs scaled by (d/768)^-1/2 (tuned at d=768).

        `matrix_optimizer="adamw"` (muonlab's `adamw_only` control, not upstream) puts every
        block matrix on AdamW instead of Muon, with `adamw_matrix_lr` (not d-scaled), the
        other groups' betas and eps, and decoupled weight decay `adamw_matrix_weight_decay`.
        `muon_options` adds keys to every Muon group (pre-polar conditioning and polar
        precision, see muonlab.optim.prepolar); empty keeps upstream's groups exactly.
        `whiten_options` adds keys to the wte, lm_head and value-embedding groups (Neumann-Gram
        vocabulary whitening, muonlab.optim.whitening). `master32` gives the wte and value-embedding
        groups fp32 master weights and moments (seed 002 §1.4e; lm_head is fp32 already).
        """
        embed = dict(master32=True) if master32 else {}
        table = dict(whiten_options or {})
        muon_options = dict(muon_options or {})
        from muonlab.optim import MuonAdamW

        matrix_params = list(self.transformer.h.parameters())
        groups_adamw = [self.lm_head, self.transformer.wte, self.value_embeds]
        n_listed = len(matrix_params) + sum(len(list(m.parameters())) for m in groups_adamw) + 2
        if n_listed != len(list(self.parameters())):
            raise RuntimeError("setup_optimizer: some parameters belong to no optimizer group")
        scale = (self.config.n_embd / 768) ** -0.5
        adamw = dict(kind="adamw", betas=tuple(adam_betas), eps=1e-10, weight_decay=0.0)
        param_groups = [
            dict(adamw, params=list(self.lm_head.parameters()), lr=unembedding_lr * scale, **table),
            dict(adamw, params=list(self.transformer.wte.parameters()), lr=embedding_lr * scale, **table, **embed),
            dict(adamw, params=list(self.value_embeds.parameters()), lr=embedding_lr * scale, **table, **embed),
            dict(adamw, params=[self.resid_lambdas], lr=scalar_lr * 0.01),
            dict(adamw, params=[self.x0_lambdas], lr=scalar_lr, betas=(0.96, 0.95)),
        ]
        if matrix_optimizer == "adamw":
            param_groups.append(dict(adamw, params=matrix_params, lr=adamw_matrix_lr,
                                     weight_decay=adamw_matrix_weight_decay))
        elif matrix_optimizer != "muon":
            raise ValueError(f"matrix_optimizer must be 'muon' or 'adamw', got {matrix_optimizer!r}")
        # one Muon group per matrix shape, so same-shape matrices are stacked in one step
        for shape in sorted({p.shape for p in matrix_params}) if matrix_optimizer == "muon" else ():
            param_groups.append(dict(
                kind="muon", params=[p for p in matrix_params if p.shape == shape], lr=matrix_lr,
                momentum=0.95, ns_steps=5, beta2=0.95, weight_decay=weight_decay, **muon_options,
            ))
        if muon_options.get("prepolar_scope", "all") not in ("all", "square_only", "rect_only"):
            names = {id(p): n for n, p in self.named_parameters()}
            for group in param_groups:  # a name scope needs names; torch wants them on every group
                group["param_names"] = [names[id(p)] for p in group["params"]]
        optimizer = (optimizer_cls or MuonAdamW)(param_groups, **optimizer_kwargs)
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer

    def forward(self, idx, targets=None, reduction="mean"):
        B, T = idx.size()
        if T > self.cos.size(1):
            raise ValueError(f"sequence length {T} exceeds the RoPE table ({self.cos.size(1)})")
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        x = norm(self.transformer.wte(idx))
        x0 = x
        for i, block in enumerate(self.transformer.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            key = str(i)
            ve = self.value_embeds[key](idx) if key in self.value_embeds else None
            x = block(x, ve, cos_sin, self.window_sizes[i])
        x = norm(x)
        logits = self.lm_head(x).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1, reduction=reduction)
