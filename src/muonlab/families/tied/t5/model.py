"""Small T5-style encoder-decoder with a 3-way tied vocabulary table, seed 004 (AF-Muon).

Seed 004 App. J.5 ("Small T5-style diagnostic"): "4 encoder layers,
4 decoder layers, hidden size 512, feed-forward size 2048, 8 attention heads, and a
49,152-token vocabulary", "fully shared setting, E_enc = E_dec = W_out^T", prefix-to-continuation
objective with source length 256 and target length 256.

Architecture (the seed-004 App. J.5 list; details the paper leaves open follow the
released small-T5 runner (not described in the paper), read for its facts, no code copied):
  - one table `wte` E in R^{V x d} used three ways (seed 004 App. I, eq. for N_alias^T5): encoder
    lookup, decoder lookup and output head. It is one stored Parameter, so autograd merges
    G_enc + G_dec + G_out on it (App. I, "Combined lookup gradients"); the head is a
    `muonlab.families.tied.model.TiedLMHead` that owns no Parameter, so `state_dict` holds the table once;
  - lookups scaled by sqrt(d), plus fixed sinusoidal positions (sin on even, cos on odd
    channels, base 10,000), each stack counting positions from 0 (released runner; unstated in seed 004 App. J.5);
  - pre-norm blocks with `muonlab.families.tied.model.RMSNorm` (learnable gain, eps 1e-6):
    encoder = self-attention + FF (2 norms), decoder = causal self-attention + cross-attention
    to the encoder output + FF (3 norms); a final RMSNorm closes each stack, and the decoder
    cross-attends to the final-normed encoder output. With these 2 + 3 per-layer norms and the
    2 final norms the count is exactly the paper's 54,561,792 (see `t5_expected_num_parameters`);
  - attention = `nn.MultiheadAttention(d, 8, bias=True, batch_first=True)` (released runner, cf. seed 004 §2.2: its
    `in_proj_weight` and `out_proj.weight` are AF-Muon matrices, its biases vectors);
  - FF = Linear(d, 2048, no bias) -> GELU (exact erf form) -> Linear(2048, d, no bias);
  - logits = h E^T over the full vocabulary (no d^-1/2 head rescaling), dropout 0;
  - init: table(s) N(0, 0.02); Linear and MultiheadAttention keep PyTorch's default init
    (Kaiming-uniform Linear, Xavier-uniform in_proj, zero attention biases); gains 1 (the
    released runner; the N(0, 0.02)-everywhere convention of the released code is stated for the
    NanoGPT / MoE / ImageGPT models only).
Untied control (`tied=False`, seed 004 Fig. 10 / Table 15, App. J.5): separate encoder
table, decoder table and bias-free head, all N(0, 0.02): 104,893,440 parameters. AF-Muon's
partition rejects it (it has no tied table); the paper trains it with Hybrid AdamW.

Data (seed 004 App. J.5; windows and BOS from the released runner): contiguous 512-token windows; source = the first
256 tokens, target = the next 256, decoder input = [BOS = 0, target[:-1]]
(`prefix_to_continuation`); 16 examples x 256 target tokens per update; AF-Muon with
rho_out/rho_hid = 1 (seed 004 Table 14): `build_optimizer(model, "afmuon", rho=1.0)`.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.families.tied.model import REDUCTIONS, RMSNorm, TiedLMHead, lm_loss, shape_config
from muonlab.families.tied.token_family import describe_counts

TABLE_PATHS = ("encoder", "decoder", "head")


@dataclass(frozen=True)
class T5Config:
    """Shape and settings of the small T5-style model; defaults are seed 004's (App. J.5)."""

    vocab_size: int = 49152  # SmolLM2 tokenizer (seed 004 App. J.5)
    n_encoder_layers: int = 4
    n_decoder_layers: int = 4
    n_embd: int = 512
    n_head: int = 8
    ff_hidden: int = 2048
    source_len: int = 256  # seed 004 App. J.5: encoder input length 256
    target_len: int = 256  # ... and decoder target length 256
    bos_id: int = 0  # decoder start token (released runner: BOS = 0; unstated in seed 004 App. J.5)
    tied: bool = True  # False: the untied control of seed 004 Fig. 10 (104.9M parameters)
    norm_eps: float = 1e-6
    init_std: float = 0.02  # the vocabulary table(s) only; see the module docstring
    pos_base: float = 10000.0  # sinusoid base (fixed positions, released runner; unstated in seed 004 App. J.5)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_encoder_layers", "n_decoder_layers", "n_embd", "n_head",
                     "ff_hidden", "source_len", "target_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_embd % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even n_embd, got {self.n_embd}")
        if not 0 <= self.bos_id < self.vocab_size:
            raise ValueError(f"bos_id={self.bos_id} is outside the vocabulary of {self.vocab_size}")
        if self.norm_eps <= 0 or self.init_std < 0:
            raise ValueError("norm_eps must be > 0 and init_std >= 0")

    @property
    def max_positions(self) -> int:
        """Rows of the sinusoid table: the longer of the source and target lengths."""
        return max(self.source_len, self.target_len)

    @property
    def window_len(self) -> int:
        """Raw tokens per example: source + target (512 in seed 004)."""
        return self.source_len + self.target_len


def t5_expected_num_parameters(cfg: T5Config) -> int:
    """Closed-form count, shared table once: V d (x 3 untied) + L_e (A + F + 2 d) +
    L_d (2 A + F + 3 d) + 2 d, with A = 4 d^2 + 4 d (MultiheadAttention: in_proj 3 d^2 + 3 d,
    out_proj d^2 + d) and F = 2 d f. Seed 004 sizes: 54,561,792 tied, 104,893,440 untied."""
    d, f = cfg.n_embd, cfg.ff_hidden
    attn, ff = 4 * d * d + 4 * d, 2 * d * f
    tables = (1 if cfg.tied else 3) * cfg.vocab_size * d
    return (tables + cfg.n_encoder_layers * (attn + ff + 2 * d)
            + cfg.n_decoder_layers * (2 * attn + ff + 3 * d) + 2 * d)


def sinusoidal_positions(n_positions: int, dim: int, base: float = 10000.0,
                         device: torch.device | str | None = None) -> torch.Tensor:
    """Fixed positions, fp32 [n_positions, dim]: PE[t, 2i] = sin(t w_i), PE[t, 2i+1] = cos(t w_i),
    w_i = base^(-2i/dim) (the fixed sinusoidal table of the released runner; unstated in seed 004 App. J.5)."""
    freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float32, device=device), freq)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean [T, T] mask for nn.MultiheadAttention: True = may not attend (j > i)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


class FeedForward(nn.Module):
    """Linear(d, f, no bias) -> GELU -> Linear(f, d, no bias) (seed 004 App. J.5: FF 2048, GELU)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d, hidden, bias=False)
        self.proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def _mha(cfg: T5Config) -> nn.MultiheadAttention:
    return nn.MultiheadAttention(cfg.n_embd, cfg.n_head, dropout=0.0, bias=True, batch_first=True)


class EncoderLayer(nn.Module):
    """Pre-norm: x + SelfAttn(norm1 x), then x + FF(norm2 x); bidirectional attention."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm1 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = _mha(cfg)
        self.norm2 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.ff = FeedForward(cfg.n_embd, cfg.ff_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class DecoderLayer(nn.Module):
    """Pre-norm: causal self-attention, cross-attention to the encoder output, FF (3 norms)."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm1 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.self_attn = _mha(cfg)
        self.norm2 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.cross_attn = _mha(cfg)
        self.norm3 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.ff = FeedForward(cfg.n_embd, cfg.ff_hidden)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        h = self.norm2(x)
        x = x + self.cross_attn(h, memory, memory, need_weights=False)[0]
        return x + self.ff(self.norm3(x))


class TiedT5(nn.Module):
    """Seed 004's small T5-style encoder-decoder; `forward(src, tgt_in, targets=None)` -> logits
    [B, T, V] or the cross-entropy (ignore_index -1). With `tied=True` one Parameter `wte.weight`
    is the encoder table, the decoder table and the output head (seed 004 App. I)."""

    def __init__(self, config: T5Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        if config.tied:
            self.dec_wte: nn.Embedding | None = None
            self.lm_head: nn.Module = TiedLMHead(self.wte)
        else:
            self.dec_wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.encoder = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.enc_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.decoder = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.dec_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.register_buffer("pos", sinusoidal_positions(config.max_positions, config.n_embd,
                                                         config.pos_base), persistent=False)
        self.lm_loss: torch.Tensor | None = None
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Tables N(0, init_std); Linear / MultiheadAttention PyTorch defaults; gains 1; positions
        rebuilt (also materialises a model built on the meta device after `to_empty`)."""
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=self.config.init_std)
            elif isinstance(m, nn.Linear):
                if m is self.lm_head:  # untied control: a vocabulary table, like the others
                    nn.init.normal_(m.weight, mean=0.0, std=self.config.init_std)
                else:
                    m.reset_parameters()
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        for m in self.modules():  # after the Linear pass, which would re-draw out_proj.bias
            if isinstance(m, nn.MultiheadAttention):
                nn.init.xavier_uniform_(m.in_proj_weight)
                nn.init.zeros_(m.in_proj_bias)
                nn.init.zeros_(m.out_proj.bias)
        c = self.config
        self.pos.copy_(sinusoidal_positions(c.max_positions, c.n_embd, c.pos_base, device=self.pos.device))

    def get_input_embeddings(self) -> nn.Embedding:
        """The encoder table (tied: the one 3-way table)."""
        return self.wte

    def get_output_embeddings(self) -> nn.Module:
        """The head; tied: its `.weight` is `get_input_embeddings().weight` (AF-Muon's check)."""
        return self.lm_head

    def decoder_embeddings(self) -> nn.Embedding:
        return self.wte if self.dec_wte is None else self.dec_wte

    def num_parameters(self) -> int:
        """Unique stored parameters: the shared table counts once."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def _embed(self, ids: torch.Tensor, module: nn.Embedding, table: torch.Tensor | None) -> torch.Tensor:
        """sqrt(d) * lookup + sinusoid. The live table goes through the nn.Embedding module (so
        forward hooks such as `af_muon.GradientSources` see both lookups); a detached one through
        F.embedding."""
        T = ids.size(1)
        if T > self.config.max_positions:
            raise ValueError(f"sequence length {T} exceeds max_positions={self.config.max_positions}")
        x = module(ids) if table is None or table is module.weight else F.embedding(ids, table)
        x = x * math.sqrt(self.config.n_embd)
        return x + self.pos[:T].to(x.dtype)

    def _tables(self, table_paths: Collection[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        unknown = set(table_paths) - set(TABLE_PATHS)
        if unknown:
            raise ValueError(f"table_paths must be drawn from {TABLE_PATHS}, got {sorted(unknown)}")
        enc, dec, head = self.wte.weight, self.decoder_embeddings().weight, self.lm_head.weight
        if not self.config.tied:
            if set(table_paths) != set(TABLE_PATHS):
                raise ValueError("table_paths applies to the tied model only")
            return enc, dec, head
        return tuple(t if p in table_paths else t.detach()  # type: ignore[return-value]
                     for p, t in zip(TABLE_PATHS, (enc, dec, head)))

    def encode(self, src: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """Source ids [B, S] -> final-normed encoder states [B, S, d]."""
        x = self._embed(src, self.wte, table)
        for layer in self.encoder:
            x = layer(x)
        return self.enc_norm(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               table: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder input ids [B, T] and encoder states -> final-normed decoder states [B, T, d]."""
        x = self._embed(tgt_in, self.decoder_embeddings(), table)
        mask = causal_mask(tgt_in.size(1), device=x.device)
        for layer in self.decoder:
            x = layer(x, memory, mask)
        return self.dec_norm(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean", table_paths: Collection[str] = TABLE_PATHS) -> torch.Tensor:
        """Logits [B, T, V] without targets, else the cross-entropy over target tokens.

        `table_paths` (tied model only) names the uses of the shared table that pass gradient to
        it: "encoder" (lookup), "decoder" (lookup), "head" (softmax); the others read a detached
        copy. The default, all three, is training; one path at a time isolates G_enc, G_dec and
        G_out of seed 004 App. I, whose sum is the merged gradient.
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        enc_t, dec_t, head_t = self._tables(table_paths)
        h = self.decode(tgt_in, self.encode(src, enc_t), dec_t)
        logits = F.linear(h, head_t)
        if targets is None:
            self.lm_loss = None
            return logits
        loss = lm_loss(logits, targets, reduction)
        self.lm_loss = loss.detach()
        return loss


def prefix_to_continuation(windows: torch.Tensor, source_len: int = 256, target_len: int = 256,
                           bos_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seed 004 App. J.5 batching: windows [B, source_len + target_len] of contiguous tokens ->
    (src = first source_len, tgt_in = [bos_id, target[:-1]], target = next target_len)."""
    if windows.ndim != 2 or windows.size(1) != source_len + target_len:
        raise ValueError(f"expected windows [B, {source_len + target_len}], got {tuple(windows.shape)}")
    src, target = windows[:, :source_len], windows[:, source_len:]
    bos = torch.full_like(target[:, :1], bos_id)
    return src, torch.cat((bos, target[:, :-1]), dim=1), target


def contiguous_windows(tokens: torch.Tensor, window_len: int = 512) -> torch.Tensor:
    """A 1-D token stream -> non-overlapping windows [N, window_len] (window i = tokens[i L:(i+1) L];
    the tail shorter than a window is dropped)."""
    if tokens.ndim != 1:
        raise ValueError(f"expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    n = tokens.numel() // window_len
    return tokens[: n * window_len].view(n, window_len)


def t5_batch(windows: torch.Tensor, cfg: T5Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`prefix_to_continuation` with the config's lengths and BOS."""
    return prefix_to_continuation(windows, cfg.source_len, cfg.target_len, cfg.bos_id)


T5_SHAPES: dict[str, T5Config] = {
    # tests and demos: well under a second per step on a CPU
    "t5-tiny": T5Config(vocab_size=512, n_encoder_layers=2, n_decoder_layers=2, n_embd=64, n_head=4,
                        ff_hidden=256, source_len=16, target_len=16),
    "t5-tiny-untied": T5Config(vocab_size=512, n_encoder_layers=2, n_decoder_layers=2, n_embd=64,
                               n_head=4, ff_hidden=256, source_len=16, target_len=16, tied=False),
    # seed 004 App. J.5 (54.6M and 104.9M; exact counts not printed): 54,561,792 parameters; untied control 104,893,440
    "t5-small": T5Config(),
    "t5-small-untied": T5Config(tied=False),
}


def build_t5(spec: str | T5Config, **overrides: object) -> TiedT5:
    """Build a `TiedT5` from a preset name or a config, with optional field overrides (on the
    current default device: under `torch.device("meta")` a shape-only model)."""
    return TiedT5(shape_config(spec, T5_SHAPES, "T5 shape", **overrides))


class PackedT5(TiedT5):
    """TiedT5 called as the loop calls a model: x = [source | decoder input], y = the targets."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None,  # type: ignore[override]
                reduction: str = "mean", table_paths=("encoder", "decoder", "head")) -> torch.Tensor:
        S = self.config.source_len
        return super().forward(x[:, :S], x[:, S:], targets, reduction, table_paths)

    def num_scaling_params(self) -> dict[str, int]:
        return describe_counts(self)

    def estimate_flops(self) -> int:
        """FLOPs per target token, forward + backward: 6 x the matrices a target token's example
        uses per target (encoder work is shared by S / T) + attention 12 d (L_e S^2 / T + L_d (T + S))."""
        c = self.config
        S, T, d = c.source_len, c.target_len, c.n_embd
        enc = sum(p.numel() for n, p in self.named_parameters() if p.ndim >= 2 and n.startswith("encoder."))
        dec = sum(p.numel() for n, p in self.named_parameters() if p.ndim >= 2 and n.startswith("decoder."))
        head = c.vocab_size * d
        attn = 12 * d * (c.n_encoder_layers * S * S / T + c.n_decoder_layers * (T + S))
        return int(6 * (enc * S / T + dec + head) + attn)
