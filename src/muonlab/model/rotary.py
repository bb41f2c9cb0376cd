"""Rotary position embeddings (RoPE) as in upstream autoresearch.

Half-split layout: channel c is rotated together with channel c + D/2, with inverse
frequency base^(-2c/D), so c = 0 is the highest frequency. Tables are computed in fp32
and rounded to bf16, as upstream does; under `precision=fp32` they are cast back up
with the rest of the model, keeping the bf16-rounded values.
"""

from __future__ import annotations

import torch


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (cos, sin), each bf16 of shape [1, seq_len, 1, head_dim // 2]."""
    channels = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
    inv_freq = 1.0 / (base ** (channels / head_dim))
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    angles = torch.outer(positions, inv_freq)
    cos = angles.cos().bfloat16()[None, :, None, :]
    sin = angles.sin().bfloat16()[None, :, None, :]
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, D] by the tables [1, T, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)
