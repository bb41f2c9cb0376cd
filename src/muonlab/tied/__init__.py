"""Tied-token model families of seed 004 (AF-Muon): NanoGPT and NanoGPT-MoE (spec-004 §3)."""

from muonlab.tied.gpt import (
    TIED_PRESETS,
    TiedGPT,
    TiedGPTConfig,
    TiedLMHead,
    build_tied_model,
    expected_num_parameters,
    scaled_relu_sq,
)
from muonlab.tied.moe import TopKMoE, load_balancing_loss, router_stats

__all__ = [
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
