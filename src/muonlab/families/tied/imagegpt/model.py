"""Tied ImageGPT-style model on RGB554 colour tokens, seed 004 (AF-Muon) App. J.7.

Seed 004 App. J.7: "8 transformer layers, 8 attention heads, head
dimension 64, hidden size 512, and MLP hidden size 2048"; images are "sequences of 1024 discrete
color tokens" from "a deterministic RGB554 tokenizer, which maps each ... RGB pixel to one of
2^14 = 16,384 color tokens"; "one start-of-sequence token, giving a total vocabulary size of
16,385"; the input prepends the start token and shifts the image right, "while the output
predicts only the 16,384 color tokens", so the start-token row gets lookup gradient only.

The network is `muonlab.families.tied.model.TiedGPT` (the released code's "shared model conventions": pre-norm
RMSNorm with gains, eps 1e-6; fused bias-free QKV; RoPE base 10,000 on interleaved pairs; causal
SDPA; ScaledReLU^2 = sqrt(2) ReLU^2 MLP; final RMSNorm; head weight = embedding weight; N(0, 0.02)
init, gains 1) reused by subclassing; only the head differs: logits = h E[:16384]^T
(`ColourHead`, whose `.weight` is still the whole tied Parameter so AF-Muon's partition finds the
tie). 33,563,648 parameters at seed 004's size (16,385 x 512 table + 8 blocks + final norm;
`muonlab.families.tied.model.expected_num_parameters` gives it, the SOS row included, the table once).

RGB554 (seed 004 App. J.7; bit layout from the released code): token = (R >> 3) * 512 + (G >> 3) * 16 + (B >> 4), raster order
(row by row, left to right). `rgb554_decode` maps a token to the centre of its colour bin
(R, G: 8 k + 4; B: 16 k + 8) by default, or to the bin's lower edge (`mode="lower"`); either
re-encodes to the same token. Metrics (seed 004 App. J.7 / Table 23, Table 20):
bits/dim = loss / (3 ln 2) (three channels per token), bits/token = loss / ln 2; the top-half
completion score conditions on the first 512 tokens and averages the NLL of the last 512.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from muonlab.data.images import RGB554_VOCAB, SOS
from muonlab.data.images import rgb554_encode as pixel_tokens
from muonlab.families.tied.model import REDUCTIONS, TiedGPT, TiedGPTConfig, TiedLMHead, lm_loss, shape_config

N_COLOURS = RGB554_VOCAB  # RGB554: 5 + 5 + 4 bits (seed 004 App. J.7: 2^14 = 16,384 colour tokens)
SOS_ID = SOS  # the start token, input-only (seed 004 App. J.7)
DECODE_MODES = ("center", "lower")


@dataclass(frozen=True)
class ImageGPTConfig(TiedGPTConfig):
    """A `TiedGPTConfig` with seed 004's ImageGPT-style defaults (App. J.7) and an image size.

    vocab_size = colours + 1: ids 0 .. vocab_size-2 are colours (predicted), vocab_size-1 is SOS
    (input-only). sequence_len must equal image_size^2 (one token per pixel, raster order).
    """

    vocab_size: int = N_COLOURS + 1
    n_layer: int = 8
    n_head: int = 8  # 8 heads x head dim 64
    n_embd: int = 512
    sequence_len: int = 1024  # 32 x 32 pixels
    mlp_ratio: int = 4  # MLP hidden 2048
    image_size: int = 32  # ImageNet-32 (seed 004 App. J.7)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moe:
            raise ValueError("the seed-004 ImageGPT-style model is dense (moe=False)")
        if self.vocab_size < 2:
            raise ValueError("vocab_size must hold at least one colour and the SOS token")
        if self.sequence_len != self.image_size ** 2:
            raise ValueError(f"sequence_len={self.sequence_len} must be "
                             f"image_size^2 = {self.image_size ** 2}")

    @property
    def n_colours(self) -> int:
        """Predicted tokens: every id but the last (16,384 for RGB554)."""
        return self.vocab_size - 1

    @property
    def sos_id(self) -> int:
        return self.vocab_size - 1

    @property
    def tokens_per_image(self) -> int:
        return self.image_size ** 2


class ColourHead(TiedLMHead):
    """The tied head restricted to the first `n_out` rows: logits = h E[:n_out]^T. `.weight` is
    the whole table (the tie AF-Muon checks); the SOS row is never an output (seed 004 App. J.7)."""

    def __init__(self, embedding: nn.Embedding, n_out: int):
        super().__init__(embedding)
        self.n_out = n_out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.weight[: self.n_out])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, logits over its first {self.n_out} rows"


class TiedImageGPT(TiedGPT):
    """Seed 004's tied ImageGPT-style model; `forward(idx, targets=None)` -> logits [B, T, n_colours]
    or the loss. `idx` is the shifted input [SOS, x_1 .. x_{T-1}] and `targets` the image
    x_1 .. x_T (`image_lm_batch`); `image_loss(tokens)` does both. K.8's `grad_source` is honoured."""

    config: ImageGPTConfig

    def __init__(self, config: ImageGPTConfig):
        super().__init__(config)
        self.lm_head = ColourHead(self.wte, config.n_colours)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean", include_aux: bool | None = None) -> torch.Tensor:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        table, source = self.wte.weight, self.config.grad_source
        h, _ = self.backbone(F.embedding(idx, table.detach()) if source == "softmax" else self.wte(idx))
        self.aux_loss = None
        logits = (F.linear(h, table.detach()[: self.config.n_colours]) if source == "lookup"
                  else self.lm_head(h))
        if targets is None:
            self.lm_loss = None
            return logits
        loss = lm_loss(logits, targets, reduction)
        self.lm_loss = loss.detach()
        return loss

    def image_loss(self, tokens: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Next-token loss of whole images [B, T] (T = tokens_per_image), SOS prepended."""
        if tokens.size(-1) != self.config.tokens_per_image:
            raise ValueError(f"expected {self.config.tokens_per_image} tokens per image, "
                             f"got {tokens.size(-1)}")
        idx, targets = image_lm_batch(tokens, self.config.sos_id)
        return self(idx, targets, reduction=reduction)


def image_lm_batch(tokens: torch.Tensor, sos_id: int = SOS_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Image tokens [B, T] -> (input [SOS, x_1 .. x_{T-1}], targets x_1 .. x_T) (seed 004 App. J.7)."""
    if tokens.ndim != 2:
        raise ValueError(f"expected image tokens [B, T], got shape {tuple(tokens.shape)}")
    if tokens.numel() and int(tokens.max()) >= sos_id:
        raise ValueError(f"image tokens must be colours < {sos_id}")
    sos = torch.full_like(tokens[:, :1], sos_id)
    return torch.cat((sos, tokens[:, :-1]), dim=1), tokens


def completion_nll(model: TiedImageGPT, tokens: torch.Tensor, n_context: int | None = None) -> torch.Tensor:
    """Top-half completion loss (seed 004 Table 23): mean NLL in nats of tokens n_context .. T-1
    given SOS and the true tokens before them (default n_context = T // 2 = 512). With a causal
    model this is the teacher-forced per-token loss of the whole image, restricted to the bottom."""
    T = tokens.size(-1)
    n_context = T // 2 if n_context is None else n_context
    if not 0 <= n_context < T:
        raise ValueError(f"n_context must be in [0, {T}), got {n_context}")
    per_token = model.image_loss(tokens, reduction="none")
    return per_token[:, n_context:].mean()


def bits_per_token(loss_nats: float | torch.Tensor) -> float | torch.Tensor:
    """loss / ln 2 (seed 004 Table 23)."""
    return loss_nats / math.log(2.0)


def bits_per_dim(loss_nats: float | torch.Tensor) -> float | torch.Tensor:
    """loss / (3 ln 2): one RGB554 token covers 3 colour channels (seed 004 Tables 1, 20)."""
    return loss_nats / (3.0 * math.log(2.0))


def rgb554_encode(images: torch.Tensor) -> torch.Tensor:
    """uint8 images [..., H, W, 3] -> int64 tokens [..., H W] in raster order (row-major); the
    per-pixel code is muonlab.data.images.rgb554_encode (one definition of the formula)."""
    images = torch.as_tensor(images)
    if images.dtype != torch.uint8:
        raise ValueError(f"expected uint8 pixels, got {images.dtype}")
    if images.ndim < 3 or images.size(-1) != 3:
        raise ValueError(f"expected images [..., H, W, 3], got shape {tuple(images.shape)}")
    return pixel_tokens(images).flatten(-2)


def rgb554_decode(tokens: torch.Tensor, image_size: int | None = None, mode: str = "center") -> torch.Tensor:
    """Tokens [..., H W] -> uint8 images [..., H, W, 3] (square, H = W = sqrt(T) unless given).

    mode "center": R, G = 8 k + 4, B = 16 k + 8 (the middle of each bin); "lower": the bin's
    lowest value (8 k, 16 k). Both re-encode to the same tokens."""
    if mode not in DECODE_MODES:
        raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
    tokens = torch.as_tensor(tokens).to(torch.int64)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= N_COLOURS):
        raise ValueError(f"RGB554 tokens must lie in [0, {N_COLOURS})")
    T = tokens.size(-1)
    side = math.isqrt(T) if image_size is None else image_size
    if side * side != T:
        raise ValueError(f"{T} tokens do not form a square {side} x {side} image")
    r, g, b = tokens // 512, (tokens // 16) % 32, tokens % 16
    if mode == "center":
        rgb = torch.stack((r * 8 + 4, g * 8 + 4, b * 16 + 8), dim=-1)
    else:
        rgb = torch.stack((r * 8, g * 8, b * 16), dim=-1)
    return rgb.to(torch.uint8).unflatten(-2, (side, side))


IMAGEGPT_SHAPES: dict[str, ImageGPTConfig] = {
    # tests and demos: 8 x 8 images (64 tokens), the full RGB554 vocabulary, d = 32
    "imagegpt-tiny": ImageGPTConfig(n_layer=2, n_head=2, n_embd=32, image_size=8, sequence_len=64),
    # the CPU presets' shape: width 128 keeps eq. 6's tied lr (0.6 / d) near the paper's scale
    "imagegpt-cpu": ImageGPTConfig(n_layer=2, n_head=2, n_embd=128, image_size=8, sequence_len=64),
    # seed 004 App. J.7 (derived from its shapes; not printed): 33,563,648 parameters
    "imagegpt": ImageGPTConfig(),
}


def build_imagegpt(spec: str | ImageGPTConfig, **overrides: object) -> TiedImageGPT:
    """Build a `TiedImageGPT` from a preset name or a config, with optional field overrides (on
    the current default device: under `torch.device("meta")` a shape-only model)."""
    return TiedImageGPT(shape_config(spec, IMAGEGPT_SHAPES, "ImageGPT shape", **overrides))


class ImageGPTModel(TiedImageGPT):
    def num_scaling_params(self) -> dict[str, int]:
        from muonlab.families.tied.token_family import describe_counts  # noqa: PLC0415

        return describe_counts(self)
