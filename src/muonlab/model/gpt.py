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
from torch.utils.checkpoint import checkpoint

from muonlab.model import scalings
from muonlab.model.attention import causal_attention, resolve_backend
from muonlab.model.lerope import apply_lerope, inv_frequencies
from muonlab.model.over_encoding import OverEncoding
from muonlab.model.residual import RADIUS_GATES, RESIDUAL_RULES, radius_gate_scale, residual_add
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
    # forward/backward variants (all off = upstream). Seed 000: pre-sublayer gains and
    # post-QK-norm scaling (muonlab.model.scalings), LeRoPE (muonlab.model.lerope); seed 003:
    # residual-addition rules and radius gates (muonlab.model.residual).
    presub_gains: str = "none"  # none | unfused_slice | unfused_contig | weight_fused | gate_scaled
    presub_param: str = "linear"  # linear | stopexp
    qk_scale: str = "none"  # none | pair_tied_linear | pair_tied_stopexp | pair_tied_exp | untied_stopexp | head_temp
    qk_freeze_layers: tuple[int, ...] = ()  # seed 002 QMASK: layers whose QK scales stay at 1
    qk_freeze_planes: int = 0  # ... and RoPE planes c < this, in every layer
    rope: str = "standard"  # standard | lerope_shared (fp32 trig) | lerope_adapted (per layer and head, bf16 trig)
    residual_rule: str = "ordinary"  # ordinary | branch_tangent | whole_state_tangent | grad_mag_control
    radius_gate: str = "none"  # none | state | branch | neutral
    checkpoint_blocks: bool = False  # non-reentrant activation checkpointing per block (seed 003)
    loss_chunk_tokens: int = 0  # > 0: lm_head + softcap + CE per chunk of this many tokens, recomputed in backward
    # seed 002: hashed n-gram Over-Encoding added to wte(idx) (muonlab.model.over_encoding; 0 = off,
    # the paper: 150,855) and decoupled residual routing (spec-002 §1.7): "sepden" adds
    # wte_lambdas[i] * norm(w) before each block, "shden" wte_lambdas[i] * w / s_{w+e}(routing_eps);
    # routing_out adds out_lambdas[0] * x0 + out_lambdas[1] * a_w before the final norm.
    oe_m: int = 0
    oe_n: int = 3
    oe_k: int = 2
    routing: str = "none"  # none | sepden | shden
    routing_out: bool = False
    routing_eps: float = 1e-6  # shden: 1e-6, or 2**-23 (F.rms_norm's fp32 default) for "f32eps"

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_kv_head > self.n_head or self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")
        if not self.window_pattern or any(c not in "SL" for c in self.window_pattern.upper()):
            raise ValueError(f"window_pattern must use only 'S' and 'L', got {self.window_pattern!r}")
        for name, value, allowed in (
                ("presub_gains", self.presub_gains, scalings.PRESUB_GAINS),
                ("presub_param", self.presub_param, scalings.PRESUB_PARAMS),
                ("qk_scale", self.qk_scale, scalings.QK_SCALES), ("rope", self.rope, ROPES),
                ("residual_rule", self.residual_rule, RESIDUAL_RULES), ("radius_gate", self.radius_gate, RADIUS_GATES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.qk_scale == "pair_tied_linear" and self.n_kv_head != self.n_head:
            raise ValueError("qk_scale=pair_tied_linear scales k per query head: it needs n_kv_head == n_head")
        if (self.qk_freeze_layers or self.qk_freeze_planes) and self.qk_scale == "none":
            raise ValueError("qk_freeze_layers/qk_freeze_planes need a qk_scale")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.routing_out and self.routing == "none":
            raise ValueError("routing_out needs routing sepden or shden")
        if self.oe_m < 0:
            raise ValueError(f"oe_m must be >= 0 (0: no Over-Encoding), got {self.oe_m}")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"loss_chunk_tokens must be >= 0, got {self.loss_chunk_tokens}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


ROPES = ("standard", "lerope_shared", "lerope_adapted")
ROUTINGS = ("none", "sepden", "shden")
VARIANT_LR_MULT = {"presub_gains": 0.04, "qk_scales": 0.04, "rope_tau": 0.04, "radius_gates": 0.04}


@dataclass
class LayerVariant:
    """One layer's slice of the variant parameters and settings (None: that variant is off)."""
    gains: torch.Tensor | None = None  # [2, d] raw gains (attention, MLP)
    gains_impl: str = "none"
    gains_param: str = "linear"
    qk: torch.Tensor | None = None  # this layer's QK-scale parameters
    qk_kind: str = "none"
    qk_mask: torch.Tensor | None = None
    rope_tau: torch.Tensor | None = None  # LeRoPE log-frequencies used by this layer
    rope_trig: torch.dtype = torch.float32
    inv_freq: torch.Tensor | None = None
    residual_rule: str = "ordinary"
    gate: torch.Tensor | None = None  # [2, 2] radius-gate (a, b) for the attention and MLP additions
    gate_kind: str = "none"

    def gain(self, which: int) -> torch.Tensor | None:
        return None if self.gains is None else scalings.gain_value(self.gains[which], self.gains_param)


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

    def forward(self, x, ve, cos_sin, window_size, lv: LayerVariant | None = None):
        B, T, _ = x.size()
        gain = None if lv is None else lv.gain(0)
        q, k, v, gate_in = self._project(x, gain, lv.gains_impl if gain is not None else "none")
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            # ResFormer value residual: gate in (0, 2), exactly 1 at zero init
            ve = ve.view(B, T, self.n_kv_head, self.head_dim)
            gate = 2 * torch.sigmoid(self.ve_gate(gate_in))
            v = v + gate.unsqueeze(-1) * ve
        if lv is not None and lv.rope_tau is not None:
            q = apply_lerope(q, lv.rope_tau, lv.inv_freq, lv.rope_trig)
            k = apply_lerope(k, lv.rope_tau, lv.inv_freq, lv.rope_trig)
        else:
            cos, sin = cos_sin
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q), norm(k)  # QK-norm after RoPE, as upstream
        if lv is not None and lv.qk is not None:
            q, k = scalings.apply_qk_scale(q, k, lv.qk, lv.qk_kind, lv.qk_mask)
        y = causal_attention(q, k, v, window_size, self.backend)
        return self.c_proj(y.contiguous().view(B, T, -1))

    def _project(self, x, gain, impl: str):
        """q, k, v projections of the normed input and the value-embedding gate's input
        (pre-sublayer gains, seed 000 §3.1: see muonlab.model.scalings for the implementations)."""
        c = self.ve_gate_channels
        if impl == "none":
            return self.c_q(x), self.c_k(x), self.c_v(x), x[..., :c]
        if impl == "weight_fused":
            w = gain[None, :]
            return (F.linear(x, self.c_q.weight * w), F.linear(x, self.c_k.weight * w),
                    F.linear(x, self.c_v.weight * w), x[..., :c])
        xs = x * gain
        gate_in = {"unfused_slice": x[..., :c], "unfused_contig": x[..., :c].contiguous(),
                   "gate_scaled": xs[..., :c]}[impl]
        return self.c_q(xs), self.c_k(xs), self.c_v(xs), gate_in


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x, gain=None, impl: str = "none"):
        if gain is None:
            h = self.c_fc(x)
        elif impl == "weight_fused":
            h = F.linear(x, self.c_fc.weight * gain[None, :])
        else:
            h = self.c_fc(x * gain)
        return self.c_proj(F.relu(h).square())


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos_sin, window_size, lv: LayerVariant | None = None):
        if lv is None:  # upstream
            x = x + self.attn(norm(x), ve, cos_sin, window_size)
            return x + self.mlp(norm(x))
        x = self._add(x, self.attn(norm(x), ve, cos_sin, window_size, lv), lv, 0)
        gain = lv.gain(1)
        return self._add(x, self.mlp(norm(x), gain, lv.gains_impl if gain is not None else "none"), lv, 1)

    @staticmethod
    def _add(u, f, lv: LayerVariant, slot: int):
        """The residual addition y = u + f, with seed 003's radius gate and backward rule."""
        if lv.gate is not None:
            a, b = lv.gate[slot, 0], lv.gate[slot, 1]
            f = radius_gate_scale(u if lv.gate_kind == "state" else f, a, b) * f
        return residual_add(u, f, lv.residual_rule)


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
        self._make_variant_params(config)

    # names of the variant parameters (GPT attributes, outside transformer.h so none lands in Muon)
    VARIANT_PARAMS = ("presub_gains", "qk_scales", "rope_tau", "radius_gates")

    def _make_variant_params(self, config: GPTConfig) -> None:
        """Create only the parameters of the variants that are on: the baseline has none."""
        L, H, D, d = config.n_layer, config.n_head, config.head_dim, config.n_embd
        if config.presub_gains != "none":
            self.presub_gains = nn.Parameter(torch.empty(L, 2, d))  # 2 L d scalars (8,192 at depth 8)
        if config.qk_scale != "none":
            shape = scalings.qk_param_shape(config.qk_scale, L, H, D)
            self.qk_scales = nn.Parameter(torch.empty(shape))
            mask = scalings.qk_freeze_mask(config.qk_scale, shape, tuple(config.qk_freeze_layers),
                                           config.qk_freeze_planes)
            if mask is not None:
                self.register_buffer("qk_mask", mask, persistent=False)
        if config.rope != "standard":
            self.rope_tau = nn.Parameter(torch.empty(D // 2) if config.rope == "lerope_shared"
                                         else torch.empty(L, H, D // 2))
            self.register_buffer("inv_freq", inv_frequencies(D), persistent=False)
        if config.radius_gate != "none":
            self.radius_gates = nn.Parameter(torch.empty(L, 2, 2))  # (a, b) per addition: 32 at depth 8
        if config.oe_m > 0:
            self.oe = OverEncoding(config.vocab_size, d, m=config.oe_m, n=config.oe_n, k=config.oe_k)
        if config.routing != "none":
            self.wte_lambdas = nn.Parameter(torch.empty(L))
            if config.routing_out:
                self.out_lambdas = nn.Parameter(torch.empty(2))

    def routing_parameters(self) -> dict[str, nn.Parameter]:
        return {name: getattr(self, name) for name in ("wte_lambdas", "out_lambdas") if hasattr(self, name)}

    def variant_parameters(self) -> dict[str, nn.Parameter]:
        return {name: getattr(self, name) for name in self.VARIANT_PARAMS if hasattr(self, name)}

    def _layer_variant(self, i: int) -> LayerVariant | None:
        c = self.config
        params = self.variant_parameters()
        if not params and c.residual_rule == "ordinary":
            return None
        lv = LayerVariant(residual_rule=c.residual_rule)
        if "presub_gains" in params:
            lv.gains, lv.gains_impl, lv.gains_param = params["presub_gains"][i], c.presub_gains, c.presub_param
        if "qk_scales" in params:
            mask = getattr(self, "qk_mask", None)
            lv.qk, lv.qk_kind, lv.qk_mask = params["qk_scales"][i], c.qk_scale, None if mask is None else mask[i]
        if "rope_tau" in params:
            tau = params["rope_tau"]
            lv.rope_tau = tau if c.rope == "lerope_shared" else tau[i]
            lv.rope_trig = torch.float32 if c.rope == "lerope_shared" else torch.bfloat16
            lv.inv_freq = self.inv_freq
        if "radius_gates" in params:
            lv.gate, lv.gate_kind = params["radius_gates"][i], c.radius_gate
        return lv

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
        # variants start neutral (gain 1, scale 1, LeRoPE = RoPE, gate 1): the baseline forward
        if hasattr(self, "presub_gains"):
            self.presub_gains.fill_(scalings.gain_init(self.config.presub_param))
        if hasattr(self, "qk_scales"):
            self.qk_scales.fill_(scalings.qk_init(self.config.qk_scale))
        if hasattr(self, "rope_tau"):
            self.rope_tau.zero_()
            self.inv_freq = inv_frequencies(self.config.head_dim, device=self.rope_tau.device)
        if hasattr(self, "radius_gates"):
            self.radius_gates.zero_()
        for p in self.routing_parameters().values():
            p.zero_()  # routing starts off: the fused forward
        if hasattr(self, "oe"):
            self.oe.reset_parameters()  # zero tables (no RNG: seeds stay paired with dense arms), bf16
        if hasattr(self, "qk_mask"):
            self.qk_mask = scalings.qk_freeze_mask(
                self.config.qk_scale, tuple(self.qk_scales.shape), tuple(self.config.qk_freeze_layers),
                self.config.qk_freeze_planes).to(self.qk_scales.device)
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
                    + sum(p.numel() for p in self.variant_parameters().values())
                    + sum(p.numel() for p in self.routing_parameters().values())
                    + (self.oe.num_parameters() if hasattr(self, "oe") else 0))
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
        counts.update({name: p.numel() for name, p in self.variant_parameters().items()})
        counts.update({name: p.numel() for name, p in self.routing_parameters().items()})
        if hasattr(self, "oe"):  # reported apart from the backbone, as seed 002's result.json did
            counts["total"] = sum(counts.values())
            counts["oe_tables"] = self.oe.num_parameters()
            counts["total_with_oe"] = counts["total"] + counts["oe_tables"]
            return counts
        counts["total"] = sum(counts.values())
        return counts

    def setup_optimizer(self, unembedding_lr=0.004, embedding_lr=0.2, matrix_lr=0.02,
                        weight_decay=0.0, adam_betas=(0.8, 0.95), scalar_lr=0.5,
                        matrix_optimizer="muon", adamw_matrix_lr=0.003, adamw_matrix_weight_decay=0.0,
                        optimizer_cls=None, muon_options=None, whiten_options=None, master32=False,
                        variant_lr_mult=None, table_whiten_options=None, **optimizer_kwargs):
        """MuonAdamW with upstream's groups; AdamW LRs scaled by (d/768)^-1/2 (tuned at d=768).

        `matrix_optimizer="adamw"` (muonlab's `adamw_only` control, not upstream) puts every
        block matrix on AdamW instead of Muon, with `adamw_matrix_lr` (not d-scaled), the
        other groups' betas and eps, and decoupled weight decay `adamw_matrix_weight_decay`.
        `muon_options` adds keys to every Muon group (pre-polar conditioning and polar
        precision, see muonlab.optim.prepolar); empty keeps upstream's groups exactly.
        `whiten_options` adds keys to the wte, lm_head and value-embedding groups (Neumann-Gram
        vocabulary whitening, muonlab.optim.whitening). `master32` gives the wte and value-embedding
        groups fp32 master weights and moments (seed 002 §1.4e; lm_head is fp32 already).
        Each variant parameter (presub_gains, qk_scales, rope_tau, radius_gates) gets its own
        AdamW group (betas `adam_betas`, eps 1e-10, no weight decay, not d-scaled) with lr =
        scalar_lr x `variant_lr_mult[name]` (default 0.04: seed 000's "0.04" = 0.04 x scalar_lr
        = 0.02; its exp03 "qk_lr 0.10" and exp07 "sub_lr 0.05" are read the same way, and the
        radius-gate lr, unstated in seed 003, uses it too). The neutral radius gate has lr 0.
        Seed 002: wte_lambdas / out_lambdas join x0_lambdas' settings (lr scalar_lr, betas (0.96,
        0.95), spec-002 §1.7); the Over-Encoding tables get the moment-free group (kind
        "oe_mfree", lr embedding_lr x (d/768)^-1/2, no weight decay, §1.3; `table_whiten_options`
        turns on table-Neumann, §1.11), wired to the tables' visit counts.
        """
        embed = dict(master32=True) if master32 else {}
        table = dict(whiten_options or {})
        muon_options = dict(muon_options or {})
        from muonlab.optim import MuonAdamW

        matrix_params = list(self.transformer.h.parameters())
        groups_adamw = [self.lm_head, self.transformer.wte, self.value_embeds]
        variants, routing = self.variant_parameters(), self.routing_parameters()
        oe_tables = list(self.oe.parameters()) if hasattr(self, "oe") else []
        n_listed = (len(matrix_params) + sum(len(list(m.parameters())) for m in groups_adamw) + 2
                    + len(variants) + len(routing) + len(oe_tables))
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
        for p in routing.values():
            param_groups.append(dict(adamw, params=[p], lr=scalar_lr, betas=(0.96, 0.95)))
        if oe_tables:
            param_groups.append(dict(kind="oe_mfree", params=oe_tables, lr=embedding_lr * scale,
                                     **(table_whiten_options or {})))
        mults = dict(VARIANT_LR_MULT, **(variant_lr_mult or {}))
        for name, p in variants.items():
            frozen = name == "radius_gates" and self.config.radius_gate == "neutral"
            param_groups.append(dict(adamw, params=[p], lr=0.0 if frozen else scalar_lr * mults[name]))
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
        if oe_tables:
            optimizer.attach_visit_counts(oe_tables, self.oe.counts())
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer

    def forward(self, idx, targets=None, reduction="mean"):
        B, T = idx.size()
        if T > self.cos.size(1):
            raise ValueError(f"sequence length {T} exceeds the RoPE table ({self.cos.size(1)})")
        cos_sin = self.cos[:, :T], self.sin[:, :T]
        w = self.transformer.wte(idx)
        if hasattr(self, "oe"):  # seed 002 §1.1: x0 = norm(wte(idx) + oe(idx))
            e = self.oe(idx)
            x = norm(w + e)
        else:
            e, x = None, norm(w)
        x0 = x
        a_w = self._routing_anchor(w, e) if self.config.routing != "none" else None
        for i, block in enumerate(self.transformer.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            if a_w is not None:
                x = x + self.wte_lambdas[i] * a_w
            key = str(i)
            ve = self.value_embeds[key](idx) if key in self.value_embeds else None
            lv = self._layer_variant(i)
            if self.config.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, ve, cos_sin, self.window_sizes[i], lv, use_reentrant=False)
            else:
                x = block(x, ve, cos_sin, self.window_sizes[i], lv)
        if hasattr(self, "out_lambdas"):
            x = x + self.out_lambdas[0] * x0 + self.out_lambdas[1] * a_w
        x = norm(x)
        if targets is not None and self.config.loss_chunk_tokens > 0:
            return self._chunked_loss(x, targets, reduction)
        logits = self._logits(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1, reduction=reduction)

    def _routing_anchor(self, w, e):
        """The token-embedding anchor a_w of decoupled routing (spec-002 §1.7): sepden norm(w)
        (its own denominator); shden w / s_{w+e}(eps), the fused anchor's denominator recomputed
        in fp32 with `routing_eps`, so a x0 + b a_w = (a e + (a + b) w) / s_{w+e}."""
        if self.config.routing == "sepden":
            return norm(w)
        w_plus_e = w if e is None else w + e
        inv_rms = torch.rsqrt(w_plus_e.float().square().mean(-1, keepdim=True) + self.config.routing_eps)
        return (w.float() * inv_rms).to(w.dtype)

    def _logits(self, x):
        logits = self.lm_head(x).float()
        return LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)

    def _token_losses(self, x, targets):
        return F.cross_entropy(self._logits(x), targets, ignore_index=-1, reduction="none")

    def _chunked_loss(self, x, targets, reduction):
        """The loss in chunks of `loss_chunk_tokens` tokens (seed 003's memory-safe path): each
        chunk's logits are recomputed in backward, so no (B*T, vocab) fp32 tensor is kept.
        Same per-token losses as the fused path; the mean's summation order differs (fp32 rounding)."""
        flat_x, flat_y = x.reshape(-1, x.size(-1)), targets.reshape(-1)
        n = self.config.loss_chunk_tokens
        losses = []
        for start in range(0, flat_y.numel(), n):
            xs, ys = flat_x[start:start + n], flat_y[start:start + n]
            if torch.is_grad_enabled():
                losses.append(checkpoint(self._token_losses, xs, ys, use_reentrant=False))
            else:
                losses.append(self._token_losses(xs, ys))
        per_token = torch.cat(losses)
        if reduction == "none":
            return per_token
        if reduction == "sum":
            return per_token.sum()
        return per_token.sum() / (flat_y != -1).sum()
