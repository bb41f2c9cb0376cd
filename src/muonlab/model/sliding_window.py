"""Sliding-window attention with PyTorch's FlexAttention: the fused path on CUDA when
FlashAttention-3 does not load.

Query i attends keys i - left <= j <= i, as FA3's window_size=(left, 0). The block mask is
built from block arithmetic alone (query block against key block), never from a T x T grid of
booleans: a key block is skipped when no query of the block can see it, computed without the
mask when every query sees every key of it ("full"), and masked element-wise by `mask_mod`
only on the window's two edges ("partial"). modded-nanogpt trained with the same scheme.

FlexAttention is a fused kernel only under torch.compile: called eagerly it computes the whole
score matrix. Inside a compiled model dynamo traces it as is; outside one (an eager CUDA run)
it goes through its own torch.compile. PyTorch's CPU FlexAttention has no backward, so the
backend trains on CUDA only; on CPU it runs forward (tests compare it with the reference).
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK_SIZE = 128  # FlexAttention's default sparse block: the kernels tile by it


def _block_indices(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count per query block, key-block indices with the selected ones first, ascending)."""
    counts = selected.sum(-1, dtype=torch.int32)
    order = torch.argsort(selected.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None], order[None, None]


def window_block_mask(seq_len: int, left: int, device: torch.device, block: int = BLOCK_SIZE) -> BlockMask:
    """The BlockMask of keys i - left <= j <= i over seq_len queries and keys (one for every
    batch row and head); the same blocks as create_block_mask's, without its T x T grid."""
    n = -(-seq_len // block)
    first = torch.arange(n, device=device) * block
    last = torch.clamp(first + block, max=seq_len) - 1  # a block's last position
    q_first, q_last, k_first, k_last = first[:, None], last[:, None], first[None, :], last[None, :]
    # some query of the block sees some key of it: the key block starts by the last query and
    # ends within the first query's window
    seen = (k_first <= q_last) & (k_last >= q_first - left)
    # every query sees every key: the keys end by the first query, start within the last one's window
    full = (k_last <= q_first) & (k_first >= q_last - left)
    # a short last block is never full (as create_block_mask has it): mask_mod also masks its
    # padding, whatever the kernel's own bounds checks do
    short = last - first + 1 < block
    full &= ~(short[:, None] | short[None, :])
    partial = seen & ~full

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx >= q_idx - left)

    kv_num, kv_idx = _block_indices(partial)
    full_num, full_idx = _block_indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(seq_len, seq_len))


_cached_block_mask = functools.lru_cache(maxsize=32)(window_block_mask)


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


def _common_dtype(q: torch.Tensor) -> torch.dtype:
    """FlexAttention wants one dtype for q, k, v; under autocast that is the autocast dtype (SDPA
    is autocast to it too), otherwise q's."""
    device = q.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype


def flex_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, H, T, D], keys i - left <= j <= i."""
    T = q.size(2)
    dtype = _common_dtype(q)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    gqa = k.size(1) != q.size(1)
    if torch.compiler.is_compiling():  # traced into the model's graph: dynamo fuses it
        return flex_attention(q, k, v, block_mask=window_block_mask(T, left, q.device), enable_gqa=gqa)
    attend = _compiled_flex_attention() if q.device.type == "cuda" else flex_attention
    return attend(q, k, v, block_mask=_cached_block_mask(T, left, q.device), enable_gqa=gqa)
