"""Tied-token model families of seed 004 (AF-Muon, spec-004 §3): NanoGPT, NanoGPT-MoE, a small T5
with a 3-way tie, ImageGPT on RGB554 colour tokens; Hugging Face families in muonlab.tied.hf."""

from muonlab.tied.gpt import (
    TIED_PRESETS,
    TiedGPT,
    TiedGPTConfig,
    TiedLMHead,
    build_tied_model,
    expected_num_parameters,
    scaled_relu_sq,
)
from muonlab.tied.imagegpt import (
    IMAGEGPT_PRESETS,
    ImageGPTConfig,
    TiedImageGPT,
    bits_per_dim,
    bits_per_token,
    build_imagegpt,
    completion_nll,
    image_lm_batch,
)
from muonlab.tied.moe import TopKMoE, load_balancing_loss, router_stats
from muonlab.tied.t5 import T5_PRESETS, T5Config, TiedT5, build_t5, prefix_to_continuation

__all__ = [
    "IMAGEGPT_PRESETS",
    "ImageGPTConfig",
    "T5Config",
    "T5_PRESETS",
    "TiedImageGPT",
    "TiedT5",
    "bits_per_dim",
    "bits_per_token",
    "build_imagegpt",
    "build_t5",
    "completion_nll",
    "image_lm_batch",
    "prefix_to_continuation",
    "TIED_PRESETS",
    "TiedGPT",
    "TiedGPTConfig",
    "TiedLMHead",
    "TopKMoE",
    "build_tied_model",
    "expected_num_parameters",
    "load_balancing_loss",
    "router_stats",
    "scaled_relu_sq",
]
