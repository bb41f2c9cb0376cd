"""Seed 004's T5Gemma2-style setting (Table 1 row 6, App. J.5 "T5Gemma2-style transfer experiment"):
the Hugging Face `google/t5gemma-2-270m-270m` configuration at random initialisation, with
`tie_word_embeddings` on, so one table is the encoder lookup, the decoder lookup and the output head
(a 3-way tie), trained on the prefix-to-continuation objective.

Nothing is downloaded: the configuration numbers below are the public ones of that checkpoint (Gemma 3
270M text stacks, d 640, 18 layers, 4 query / 1 KV heads of 256, MLP 2048, sliding window 512 on five
layers of six; a SigLIP so400m vision tower without its pooling head). They reproduce the paper's
786,029,296 parameters exactly at a 262,144-row table (`PAPER_NUM_PARAMETERS`): the README's
262,144 x 640 tied table, not the 262,208 rows the paper text names (seed 004 App. J.5; Table 16 says 262k).

Choices where the paper is silent:
- The vision tower and its projector are built (the paper's parameter count includes them) but frozen:
  text-only training gives them no gradient, so every optimizer skipped them anyway; frozen, no
  optimizer gives them a role or state, and gradient clipping and weight decay never see them.
- The table has one row per token id the data can hold (as the other Hugging Face settings); the
  paper preset's count is checked at the Gemma tokenizer's 262,144.
- Gradient checkpointing (the paper's, for memory) is not used: it changes no number.
Needs the optional `transformers` dependency (`pip install 'muonlab[hf]'`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from muonlab.families.tied.model import lm_loss
from muonlab.families.tied.token_family import describe_counts

PAPER_NUM_PARAMETERS = 786_029_296  # afmoun README, not printed in seed 004, at a 262,144-row table
PAPER_VOCAB = 262_144

# (text stack shared by encoder and decoder, vision tower); encoder and decoder are the same shape
T5GEMMA2_MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "t5gemma2-270m": (
        dict(vocab_size=PAPER_VOCAB, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
             num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
             sliding_window=512, max_position_embeddings=32768, rms_norm_eps=1e-6,
             hidden_activation="gelu_pytorch_tanh"),
        dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
             patch_size=14, image_size=896, vision_use_head=False),
    ),
    # seconds on a CPU: the same architecture, one sliding and one global layer per stack
    "t5gemma2-tiny": (
        dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
             max_position_embeddings=512, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
             layer_types=["sliding_attention", "full_attention"]),
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=4,
             image_size=16, vision_use_head=False),
    ),
}
_MM_TOKENS = {"t5gemma2-270m": 256, "t5gemma2-tiny": 4}  # image tokens after the projector's pooling


def t5gemma2_config(name: str, vocab_size: int | None = None):
    """The transformers T5Gemma2Config of `name`, tied embeddings forced on."""
    from muonlab.families.tied.hf.model import require_transformers

    T5Gemma2Config = require_transformers().T5Gemma2Config
    if name not in T5GEMMA2_MODELS:
        raise ValueError(f"unknown T5Gemma2 shape {name!r}; choose from {', '.join(T5GEMMA2_MODELS)}")
    text, vision = T5GEMMA2_MODELS[name]
    text = {**text, "tie_word_embeddings": True, **({"vocab_size": vocab_size} if vocab_size else {})}
    return T5Gemma2Config(encoder=dict(text_config=text, vision_config={"model_type": "siglip_vision_model", **vision},
                                       mm_tokens_per_image=_MM_TOKENS[name]),
                          decoder=dict(text), tie_word_embeddings=True)


def build_t5gemma2(name: str, vocab_size: int | None = None, device: str | torch.device | None = None) -> nn.Module:
    """A random-init T5Gemma2ForConditionalGeneration whose encoder lookup, decoder lookup and head
    are one Parameter; the vision tower and projector frozen (see the module docstring)."""
    from muonlab.families.tied.hf.model import require_transformers

    AutoModelForSeq2SeqLM = require_transformers().AutoModelForSeq2SeqLM
    with contextlib.nullcontext() if device is None else torch.device(device):  # None: the ambient device
        model = AutoModelForSeq2SeqLM.from_config(t5gemma2_config(name, vocab_size))
    encoder = model.model.encoder
    for module in (encoder.vision_tower, encoder.multi_modal_projector):
        module.requires_grad_(False)
    table = model.get_input_embeddings().weight
    if not (model.get_output_embeddings().weight is table is model.model.decoder.embed_tokens.weight):
        raise RuntimeError(f"{name}: the encoder lookup, decoder lookup and head are not one table")
    return model


def num_parameters(model: nn.Module, trainable: bool = False) -> int:
    """Unique parameters (the tied table once); `trainable`: only those that train."""
    unique = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in unique if p.requires_grad or not trainable)


class PackedT5Gemma2(nn.Module):
    """A T5Gemma2ForConditionalGeneration called as the loop calls a model (x = [source | decoder
    input], y = the targets), like `PackedT5`."""

    def __init__(self, model: nn.Module, source_len: int, target_len: int):
        super().__init__()
        self.model, self.source_len, self.target_len = model, source_len, target_len

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        S = self.source_len
        logits = self.model(input_ids=x[:, :S], decoder_input_ids=x[:, S:], use_cache=False).logits
        return logits if targets is None else lm_loss(logits, targets, reduction)

    def num_scaling_params(self) -> dict[str, int]:
        return describe_counts(self)

    def estimate_flops(self) -> int:
        """FLOPs per target token, forward + backward, as PackedT5's: 6 x the trained matrices (encoder
        ones by S / T; the table once, as the head) + attention 12 h (L_e S^2 / T + L_d (T + S)), h the
        query width (heads x head dim); the decoder's merged attention sees T + S keys."""
        S, T = self.source_len, self.target_len
        text = self.model.config.decoder
        table = self.get_input_embeddings().weight
        trained = [(n, p) for n, p in self.named_parameters() if p.requires_grad and p.ndim >= 2 and p is not table]
        enc = sum(p.numel() for n, p in trained if ".encoder." in n)
        dec = sum(p.numel() for n, p in trained if ".decoder." in n)
        h = text.num_attention_heads * text.head_dim
        attn = 12 * h * text.num_hidden_layers * (S * S / T + T + S)
        return int(6 * (enc * S / T + dec + table.numel()) + attn)
