"""Hugging Face model families of seed 004, built from their public configuration numbers.

Random initialisation with tied input/output embeddings, as the paper trained them (seed 004 App. J.2–J.4
and J.8); nothing is downloaded: the numbers below are the public `config.json`
values the spec quotes. Needs the optional `transformers` dependency (`pip install muonlab[hf]`).

    SmolLM2-135M   Llama, d 576, 30 layers, 9 heads / 3 KV, MLP 1536, vocab 49,152: 134,515,008 params
    Qwen2.5-0.5B   Qwen2, d 896, 24 layers, 14 heads / 2 KV, MLP 4864, vocab 151,936 (q/k/v biases)
    Llama-3.2-1B   Llama, d 2048, 16 layers, 32 heads / 8 KV, MLP 8192, vocab 128,256: 1,235,814,400
    protein Llama  Llama, d 960, 32 layers, 15 heads / 5 KV, MLP 2560, RoPE 1e5, vocab 50,257 (~363M)
    tiny-llama     a CPU-sized Llama (SmolLM2's and Llama-3.2's architecture) for tests and demos
    tiny-qwen2     a CPU-sized Qwen2 (Qwen2.5's architecture: q/k/v biases)

Llama-3.2-1B keeps its public config's "llama3" RoPE scaling (factor 32, low/high frequency factors 1 and
4, original context 8,192): it remaps the rotary frequencies, not the positions, so it acts at every
context (17 of the 32 inverse frequencies differ from plain RoPE's). max_position_embeddings is set to
the training context the caller passes (default 2048; the FLOP count reads it).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import nn

from muonlab.families.tied.model import lm_loss
from muonlab.families.tied.token_family import describe_counts

from muonlab.optional import require

# meta-llama/Llama-3.2-1B config.json's rope_scaling, as published
LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192}

HF_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         rope_theta=100000.0, rms_norm_eps=1e-5)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                         rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "llama-3.2-1b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                         rope_theta=500000.0, rms_norm_eps=1e-5, rope_scaling=LLAMA3_ROPE_SCALING)),
    "protein-llama": ("LlamaConfig", dict(vocab_size=50257, hidden_size=960, intermediate_size=2560,
                                          num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                                          rope_theta=100000.0, rms_norm_eps=1e-5)),
    "tiny-llama": ("LlamaConfig", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)),
    # Qwen2.5's architecture (q/k/v biases, RoPE 1e6, RMSNorm 1e-6) at the CPU size
    "tiny-qwen2": ("Qwen2Config", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0,
                                       rms_norm_eps=1e-6)),
}


def require_transformers():
    """The optional `transformers` module, or a one-line usage error that says how to install it."""
    return require("transformers", "the Hugging Face model families")


def hf_config(name: str, max_positions: int = 2048, **overrides: Any):
    """The transformers config of `name`, tied embeddings on."""
    transformers = require_transformers()
    if name not in HF_MODELS:
        raise ValueError(f"unknown Hugging Face family {name!r}; choose from {', '.join(HF_MODELS)}")
    cls_name, values = HF_MODELS[name]
    values = {**values, "max_position_embeddings": max_positions, "tie_word_embeddings": True, **overrides}
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)  # transformers warns that 8,192 exceeds the training context: it is the original
    try:
        return getattr(transformers, cls_name)(**values)
    finally:
        logger.setLevel(level)


def build_hf_model(name: str, device: str | torch.device | None = None, **overrides: Any):
    """A random-init causal LM of `name` whose output embedding is its input embedding."""
    cfg = hf_config(name, **overrides)
    AutoModelForCausalLM = require_transformers().AutoModelForCausalLM
    with contextlib.nullcontext() if device is None else torch.device(device):  # None: the ambient device
        model = AutoModelForCausalLM.from_config(cfg)
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError(f"{name}: the output embedding is not tied to the input embedding")
    return model


def unique_parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


class HFCausalLM(nn.Module):
    """A transformers causal LM called as the loop calls a model: (idx, targets) -> the loss."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        logits = self.model(input_ids=idx, use_cache=False).logits
        return logits if targets is None else lm_loss(logits, targets, reduction)

    def num_scaling_params(self) -> dict[str, int]:
        return describe_counts(self)

    def estimate_flops(self) -> int:
        """FLOPs per token, forward + backward: 6 x the matrices (the tied table once, as the head)
        + causal attention 12 L d T (the autoresearch convention)."""
        c = self.model.config
        matrices = sum(p.numel() for p in {id(p): p for p in self.parameters()}.values() if p.ndim >= 2)
        return 6 * matrices + 12 * c.num_hidden_layers * c.hidden_size * c.max_position_embeddings
