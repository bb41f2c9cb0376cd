"""An independent transcription of causal sliding-window attention, for the attention tests."""

import math

import torch


def naive_attention(q, k, v, left):
    """Per-query softmax over keys j with i - left <= j <= i; GQA by repeating KV heads."""
    B, T, H, D = q.shape
    rep = H // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    out = torch.zeros_like(q)
    for i in range(T):
        lo = max(0, i - left)
        scores = torch.einsum("bhd,bjhd->bhj", q[:, i], k[:, lo:i + 1]) / math.sqrt(D)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", scores.softmax(-1), v[:, lo:i + 1])
    return out
