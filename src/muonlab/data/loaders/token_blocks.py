"""Block loaders over a token memmap: the NanoGPT / MoE loader of seed paper 004 (AF-Muon,
App. J.1, J.6; block loader details from the released code), and the view the other seed-004 loaders build on.

Block i is tokens[i*L : i*L + L + 1] with L = 1024, so the inputs x = block[:-1] of
consecutive blocks do not overlap and tile the file; the one extra target token is the first
token of the next block (NanoGPT style, y = block[1:]). Blocks are shuffled by a
`torch.Generator` seeded with the run seed, batched with drop_last; eval reads a separate
file in order.

Choices (documented where the reference leaves room):

* Order reproduces the reference's `DataLoader(shuffle=True, generator=manual_seed(seed),
  drop_last=True)` exactly: each pass draws one int64 (the DataLoader's base seed), then
  `randperm(n)`, and a finished pass draws one more `randperm(n)` (RandomSampler's
  trailing empty slice). A test checks this against torch's DataLoader over 3 epochs.
* Loaders are infinite: pass e+1 starts when pass e is used up, as the reference's
  training loops re-create the iterator on StopIteration. `num_blocks` caps the blocks
  used (the reference uses the first `iterations * batch` blocks; pass the min yourself).
* Available blocks: (N - 1) // L with a target token, N // L without (`count_blocks`).
* Resume: `state_dict()` is plain ints (epoch from 1, position = batches taken in the
  epoch, plus the settings it was made with); `load_state_dict` replays the generator
  from the seed, so no RNG bytes are stored and nothing is pickled.
* Ranks: with `world_size` W, rank r's k-th batch is global batch k*W + r (as
  `BestFitLoader`), so W ranks see the micro-batches of one process.
* Batches are int64 torch tensors; block loaders yield (x, y, epoch) like `BestFitLoader`
  (or (blocks, epoch) without a target); eval helpers yield batches only. The NanoGPT
  eval loss is the mean of per-batch mean losses, the HF/T5 scripts weight by target
  count: that reduction is the caller's; these helpers only provide the blocks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
import torch

from muonlab.data.memmap_format import TokenMemmap, count_blocks, open_memmap
from muonlab.errors import UsageError

_STATE_VERSION = 1


class MemmapBlockLoader:
    """Batches of non-overlapping blocks of a token memmap, shuffled per seed; resumable.

    Block i starts at token i*block_len and holds block_len (+1 with `with_target`)
    tokens. Iterating yields, forever, (x, y, epoch) with x = block[:-1], y = block[1:]
    (int64 [B, block_len]) when `with_target`, else (blocks, epoch). `epoch` counts
    passes from 1. Order and the generator draws match torch's DataLoader with
    `shuffle=True, generator=torch.Generator().manual_seed(seed)` (see module docstring);
    `shuffle=False` reads blocks in file order.
    """

    def __init__(
        self,
        memmap: "TokenMemmap | str | os.PathLike",
        block_len: int,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = True,
        with_target: bool = True,
        shuffle: bool = True,
        num_blocks: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ):
        self.memmap = open_memmap(memmap)
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        available = count_blocks(self.memmap, block_len, with_target)
        if num_blocks is None:
            num_blocks = available
        elif not 0 < num_blocks <= available:
            raise UsageError(
                f"{self.memmap.path} holds {available} blocks of {block_len}{' + 1' if with_target else ''} "
                f"tokens; num_blocks={num_blocks} is not in [1, {available}]"
            )
        self.block_len, self.batch_size, self.seed = int(block_len), int(batch_size), int(seed)
        self.drop_last, self.with_target, self.shuffle = bool(drop_last), bool(with_target), bool(shuffle)
        self.num_blocks = int(num_blocks)
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = torch.device(device)
        per_epoch = self.num_blocks // self.batch_size if drop_last else -(-self.num_blocks // self.batch_size)
        if per_epoch == 0:
            raise UsageError(
                f"{self.memmap.path} has {self.num_blocks} blocks of {block_len} tokens: "
                f"fewer than one batch of {batch_size} (drop_last)"
            )
        self.batches_per_epoch = per_epoch
        self._reset()

    # --- order ----------------------------------------------------------------------
    def _reset(self) -> None:
        self.epoch = 1
        self.position = 0  # global batches taken from the current epoch
        self._generator = torch.Generator().manual_seed(self.seed)
        self._order: torch.Tensor | None = None  # block order of the current epoch

    def _begin_epoch(self) -> None:
        if self.shuffle:
            # DataLoader.__iter__ draws its base seed, then RandomSampler draws randperm(n).
            torch.empty((), dtype=torch.int64).random_(generator=self._generator)
            self._order = torch.randperm(self.num_blocks, generator=self._generator)
        else:
            self._order = torch.arange(self.num_blocks)

    def _end_epoch(self) -> None:
        if self.shuffle:
            # RandomSampler's trailing `randperm(n)[:0]`, evaluated when a pass runs out.
            torch.randperm(self.num_blocks, generator=self._generator)
        self.epoch += 1
        self.position = 0
        self._order = None

    def _next_indices(self) -> tuple[np.ndarray, int]:
        """Block ids of this rank's next batch (and its epoch); advances every rank's stream."""
        mine = None
        for k in range(self.world_size):
            if self.position >= self.batches_per_epoch:
                self._end_epoch()
            if self._order is None:
                self._begin_epoch()
            if k == self.rank:
                lo = self.position * self.batch_size
                mine = (self._order[lo : lo + self.batch_size].numpy(), self.epoch)
            self.position += 1
        return mine

    # --- batches --------------------------------------------------------------------
    def gather(self, block_ids: np.ndarray) -> torch.Tensor:
        """The blocks with these ids, int64 [len, block_len (+1)]."""
        width = self.block_len + (1 if self.with_target else 0)
        out = np.empty((len(block_ids), width), dtype=np.int64)
        tokens = self.memmap.tokens
        for row, b in enumerate(block_ids):
            start = int(b) * self.block_len
            out[row] = tokens[start : start + width]
        return torch.from_numpy(out)

    def __iter__(self) -> "MemmapBlockLoader":
        return self

    def next_blocks(self) -> tuple[torch.Tensor, int]:
        """(blocks [B, block_len (+1)], epoch) of the next batch, before any x/y split."""
        ids, epoch = self._next_indices()
        return self.gather(ids).to(self.device), epoch

    def __next__(self):
        blocks, epoch = self.next_blocks()
        if self.with_target:
            return blocks[:, :-1], blocks[:, 1:], epoch
        return blocks, epoch

    # --- resume ---------------------------------------------------------------------
    def _config(self) -> dict:
        return {
            "num_tokens": self.memmap.num_tokens,
            "seed": self.seed,
            "block_len": self.block_len,
            "batch_size": self.batch_size,
            "num_blocks": self.num_blocks,
            "with_target": self.with_target,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "world_size": self.world_size,
        }

    def state_dict(self) -> dict:
        """Plain ints and bools: the settings plus (epoch, position) of the batch stream."""
        return {"version": _STATE_VERSION, "kind": "memmap_blocks", **self._config(),
                "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly where `state` was taken: the next batch is the one that followed."""
        if state.get("version") != _STATE_VERSION or state.get("kind") != "memmap_blocks":
            raise UsageError(f"not a memmap block loader state (version {state.get('version')!r}, "
                             f"kind {state.get('kind')!r})")
        for key, mine in self._config().items():
            if state.get(key) != mine:
                raise UsageError(f"loader state has {key}={state.get(key)!r}, this loader has {mine!r}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 1 or not 0 <= position <= self.batches_per_epoch:
            raise UsageError(f"loader state has an impossible position (epoch {epoch}, batch {position})")
        self._reset()
        for _ in range(epoch - 1):  # replay the generator: draws of each finished epoch
            self._begin_epoch()
            self._end_epoch()
        if position > 0:
            self._begin_epoch()
        self.position = position


def eval_batches(
    memmap: "TokenMemmap | str | os.PathLike",
    block_len: int,
    batch_size: int,
    max_tokens: int | None = None,
    max_batches: int | None = None,
    with_target: bool = True,
    drop_last: bool = True,
    device: str | torch.device = "cpu",
) -> Iterator:
    """One in-order pass over the eval file: (x, y) batches (or blocks without a target).

    As the reference NanoGPT eval: ceil(max_tokens / block_len) blocks (capped at the
    file), batched with drop_last; 5M tokens at L = 1024, B = 16 is 305 batches. The paper's
    NanoGPT eval loss is the mean of the per-batch mean losses over these batches.
    """
    mm = open_memmap(memmap)
    available = count_blocks(mm, block_len, with_target)
    n = available if max_tokens is None else min(available, math.ceil(max_tokens / block_len))
    if n < 1:
        raise UsageError(f"{mm.path} holds no block of {block_len}{' + 1' if with_target else ''} tokens to evaluate")
    loader = MemmapBlockLoader(mm, block_len, batch_size, drop_last=drop_last, with_target=with_target,
                               shuffle=False, num_blocks=n, device=device)
    count = loader.batches_per_epoch if max_batches is None else min(max_batches, loader.batches_per_epoch)
    for _ in range(count):
        batch = next(loader)
        yield batch[:-1] if with_target else batch[0]


class BlockLoaderView:
    """A loader that reshapes the batches of an inner MemmapBlockLoader (`self.blocks`)."""

    blocks: MemmapBlockLoader

    @property
    def epoch(self) -> int:
        return self.blocks.epoch

    @property
    def batches_per_epoch(self) -> int:
        return self.blocks.batches_per_epoch

    def __iter__(self):
        return self

    def state_dict(self) -> dict:
        return self.blocks.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.blocks.load_state_dict(state)
