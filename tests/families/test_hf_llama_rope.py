"""Llama-3.2-1B keeps its public "llama3" RoPE frequency scaling (issue 31 item 6): the rotary
frequencies of the family's config, as transformers computes them, equal an independent transcription
of Meta's formula, and differ from plain RoPE's in 17 of 32 planes (a remapping of frequencies, not of
positions: it acts at the 1,024-token training context)."""

from __future__ import annotations

import math

import pytest
import torch

from muonlab.families.tied.hf.model import hf_config


def llama3_inv_freq(head_dim: int = 64, theta: float = 500000.0, factor: float = 32.0, low: float = 1.0,
                    high: float = 4.0, original: int = 8192) -> torch.Tensor:
    """Meta's llama3 scaling, written out: long wavelengths divided by `factor`, short ones kept, a
    linear blend in between."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(freq)
        elif wavelen > original / low:
            out.append(freq / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


@pytest.fixture(scope="module")
def LlamaRotaryEmbedding():
    """transformers' Llama rotary embedding, imported in a fixture: collecting stays cheap, and the import (~2 CPU s
    for the worker that imports transformers first) is not charged to the test's budgeted call."""
    pytest.importorskip("transformers", reason="the Hugging Face families need transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding


def test_the_llama_3_2_rotary_frequencies_are_the_scaled_ones(LlamaRotaryEmbedding):  # noqa: N803 (the class)
    scaled = LlamaRotaryEmbedding(hf_config("llama-3.2-1b", max_positions=1024)).inv_freq.double()
    plain = LlamaRotaryEmbedding(hf_config("llama-3.2-1b", max_positions=1024, rope_scaling=None)).inv_freq.double()
    expected = llama3_inv_freq()
    assert torch.allclose(scaled, expected, rtol=1e-6, atol=0)
    assert int((scaled != plain).sum()) == 17 and scaled.numel() == 32
    assert float(((plain - scaled) * 1023).abs().max()) > 0.9  # radians at the last training position
