"""Causal sliding-window attention with two backends.

`fa3`: FlashAttention-3 loaded through the `kernels` package on CUDA, as upstream does
(varunneal's Hopper build on sm_90, kernels-community elsewhere). `sdpa`: PyTorch's
scaled_dot_product_attention with an explicit causal window mask, used on CPU/MPS and
whenever the kernel cannot be loaded (e.g. offline). Both see the same keys: query i
attends to keys j with i - left <= j <= i, where `left` is the layer's window.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("auto", "fa3", "sdpa")


@functools.lru_cache(maxsize=None)
def _load_fa3(capability: tuple[int, int]):
    """Return the flash_attn_interface module, or None when it cannot be loaded."""
    try:
        from kernels import get_kernel

        repo = "varunneal/flash-attention-3" if capability == (9, 0) else "kernels-community/flash-attn3"
        return get_kernel(repo).flash_attn_interface
    except Exception as exc:  # offline, unsupported GPU, missing build: fall back to SDPA
        log.warning("FlashAttention-3 unavailable (%s); using SDPA", exc.__class__.__name__)
        return None


def resolve_backend(requested: str, device: torch.device) -> str:
    """Pick the attention backend actually used on `device`."""
    if requested not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {requested!r}")
    if device.type != "cuda" or requested == "sdpa":
        return "sdpa"
    fa3 = _load_fa3(torch.cuda.get_device_capability(device))
    if fa3 is None:
        if requested == "fa3":
            log.warning("attention backend 'fa3' requested but not loadable; using SDPA")
        return "sdpa"
    return "fa3"


@functools.lru_cache(maxsize=32)
def window_mask(seq_len: int, left: int, device: torch.device) -> torch.Tensor:
    """Boolean [T, T] mask, True where query i may attend key j (i - left <= j <= i)."""
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (j <= i) & (j >= i - left)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: tuple[int, int], backend: str) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, Hkv, D] -> [B, T, H, D]; window = (left, right=0)."""
    if backend == "fa3":
        fa3 = _load_fa3(torch.cuda.get_device_capability(q.device))
        return fa3.flash_attn_func(q, k, v, causal=True, window_size=window)
    T = q.size(1)
    left = window[0]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = k.size(2) != q.size(2)
    if left < 0 or left >= T - 1:
        # the window covers the whole causal prefix: plain causal attention
        y = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    else:
        mask = window_mask(T, left, q.device)
        y = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    return y.transpose(1, 2)
