"""The prefix-to-continuation loader of seed paper 004's small T5 (AF-Muon, App. J.5).

Contiguous 512-token windows of a token memmap: the first 256 are the encoder input
(source), the next 256 the decoder target, and the decoder input is [BOS = 0, target[:-1]].
Order, epochs, ranks and resume are those of `MemmapBlockLoader`.
"""

from __future__ import annotations

import math

import torch

from muonlab.data.loaders.token_blocks import BlockLoaderView, MemmapBlockLoader
from muonlab.data.memmap_format import count_blocks, open_memmap
from muonlab.errors import UsageError


def split_prefix_continuation(
    windows: torch.Tensor, src_len: int, tgt_len: int, bos: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, tgt_in, tgt) of windows [B, src_len + tgt_len]: tgt_in = [bos, tgt[:-1]]."""
    src = windows[:, :src_len]
    tgt = windows[:, src_len : src_len + tgt_len]
    start = torch.full((windows.shape[0], 1), int(bos), dtype=windows.dtype, device=windows.device)
    return src, torch.cat([start, tgt[:, :-1]], dim=1), tgt


class PrefixContinuationLoader(BlockLoaderView):
    """Seed 004 small-T5 batches (App. J.5): (src, tgt_in, tgt), int64 [B, 256] each.

    Windows of src_len + tgt_len contiguous tokens tile the file (window i starts at
    i*(src_len + tgt_len)); the first src_len are the encoder input, the next tgt_len the
    decoder target, and the decoder input is [bos, tgt[:-1]]. Shuffling, epochs, ranks
    and resume are those of `MemmapBlockLoader` (`epoch` is an attribute here).
    """

    def __init__(self, memmap, *, batch_size: int, seed: int = 0, src_len: int = 256, tgt_len: int = 256,
                 bos: int = 0, shuffle: bool = True, drop_last: bool = True, num_examples: int | None = None,
                 rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu"):
        if src_len < 1 or tgt_len < 1:
            raise UsageError(f"src_len and tgt_len must be >= 1, got {src_len}, {tgt_len}")
        mm = open_memmap(memmap)
        if not 0 <= bos < mm.vocab_size:
            raise UsageError(f"bos={bos} is outside the vocabulary [0, {mm.vocab_size}) of {mm.path}")
        self.src_len, self.tgt_len, self.bos = int(src_len), int(tgt_len), int(bos)
        self.blocks = MemmapBlockLoader(mm, src_len + tgt_len, batch_size, seed, drop_last=drop_last,
                                        with_target=False, shuffle=shuffle, num_blocks=num_examples,
                                        rank=rank, world_size=world_size, device=device)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        windows, _ = self.blocks.next_blocks()
        return split_prefix_continuation(windows, self.src_len, self.tgt_len, self.bos)

    def state_dict(self) -> dict:
        return {**self.blocks.state_dict(), "src_len": self.src_len, "tgt_len": self.tgt_len, "bos": self.bos}

    def load_state_dict(self, state: dict) -> None:
        for key in ("src_len", "tgt_len", "bos"):
            if state.get(key) != getattr(self, key):
                raise UsageError(f"loader state has {key}={state.get(key)!r}, this loader has {getattr(self, key)!r}")
        self.blocks.load_state_dict({k: v for k, v in state.items() if k not in ("src_len", "tgt_len", "bos")})


def prefix_continuation_batches(memmap, *, batch_size: int, seed: int = 0, src_len: int = 256,
                                tgt_len: int = 256, bos: int = 0, **kwargs) -> PrefixContinuationLoader:
    """Infinite, resumable (src, tgt_in, tgt) batches; see `PrefixContinuationLoader`."""
    return PrefixContinuationLoader(memmap, batch_size=batch_size, seed=seed, src_len=src_len,
                                    tgt_len=tgt_len, bos=bos, **kwargs)


def prefix_continuation_eval_batches(memmap, *, batch_size: int, src_len: int = 256, tgt_len: int = 256,
                                     bos: int = 0, max_target_tokens: int | None = None,
                                     drop_last: bool = False, device: str | torch.device = "cpu"):
    """One in-order pass of (src, tgt_in, tgt) over an eval file.

    As the reference T5 eval: ceil(max_target_tokens / tgt_len) windows (capped at the
    file), last batch kept (drop_last=False); its loss is the target-count-weighted mean.
    """
    mm = open_memmap(memmap)
    available = count_blocks(mm, src_len + tgt_len, with_target=False)
    n = available if max_target_tokens is None else min(available, math.ceil(max_target_tokens / tgt_len))
    if n < 1:
        raise UsageError(f"{mm.path} holds no window of {src_len + tgt_len} tokens to evaluate")
    loader = PrefixContinuationLoader(mm, batch_size=batch_size, src_len=src_len, tgt_len=tgt_len, bos=bos,
                                      shuffle=False, drop_last=drop_last, num_examples=n, device=device)
    for _ in range(loader.batches_per_epoch):
        yield next(loader)
