"""Contiguous token memmaps and their block loaders (seed paper 004, AF-Muon, spec §3).

Seed 004 trains from pre-tokenized caches: one flat little-endian array of token ids
per split (uint16 when the vocabulary fits, else uint32) next to a `metadata.json`.
Its loaders (spec §3 "Data [ref]", rows 1, 5, 7, 8) are:

* NanoGPT / MoE (rows 1, 7): block i is tokens[i*L : i*L + L + 1] with L = 1024, so the
  inputs x = block[:-1] of consecutive blocks do not overlap and tile the file; the one
  extra target token is the first token of the next block (NanoGPT style, y = block[1:]).
  Blocks are shuffled by a `torch.Generator` seeded with the run seed, batched with
  drop_last; eval reads a separate file in order.
* small T5 (row 5): contiguous 512-token windows, first 256 = source, next 256 = target,
  decoder input [BOS = 0, target[:-1]] ("prefix-to-continuation").
* ImageGPT (row 8): 1024-token images, no extra target token (see `images.py`).

On-disk schema (`METADATA_FORMAT`, version 1). One `metadata.json` per directory holds
an entry per `.bin` file of that directory, so train and eval splits share it::

    {"format": "muonlab-token-memmap", "version": 1,
     "files": {"train.bin": {"dtype": "uint16", "num_tokens": 123456,
                             "vocab_size": 50304, "tokenizer": "smollm2",
                             "extra": {...free-form JSON...}}}}

`dtype` is "uint16" or "uint32" (stored little-endian), `num_tokens` must equal the file
size divided by the item size, every id must be < `vocab_size` (checked in full on write,
on a deterministic sample on open, in full with `TokenMemmap.validate(full=True)`), and
`tokenizer` names the tokenizer. Any violation is a `UsageError` naming the file. The
reference's own metadata layout (train_path / eval_path / block counts) is not read; use
`register_token_memmap` to describe an existing .bin without rewriting it.

Choices (documented where the reference leaves room):

* Order reproduces the reference's `DataLoader(shuffle=True, generator=manual_seed(seed),
  drop_last=True)` exactly: each pass draws one int64 (the DataLoader's base seed), then
  `randperm(n)`, and a finished pass draws one more `randperm(n)` (RandomSampler's
  trailing empty slice). A test checks this against torch's DataLoader over 3 epochs.
* Loaders are infinite: pass e+1 starts when pass e is used up, as the reference's
  training loops re-create the iterator on StopIteration. `num_blocks` caps the blocks
  used (the reference uses the first `iterations * batch` blocks; pass the min yourself).
* Available blocks: (N - 1) // L with a target token, N // L without.
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

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import torch

from muonlab.atomic import atomic_open, write_json
from muonlab.errors import UsageError

METADATA_NAME = "metadata.json"
METADATA_FORMAT = "muonlab-token-memmap"
METADATA_VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_STATE_VERSION = 1
_SAMPLE_WINDOWS = 16  # sampled vocab check on open: windows spread over the file
_SAMPLE_WINDOW_TOKENS = 1 << 16
_CHUNK = 1 << 22  # tokens per chunk for full scans


# --- metadata -------------------------------------------------------------------------
def metadata_path(bin_path: str | os.PathLike) -> Path:
    """The `metadata.json` that describes `bin_path` (the one in its directory)."""
    return Path(bin_path).parent / METADATA_NAME


def default_dtype(vocab_size: int) -> str:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def _read_manifest(meta: Path, missing_ok: bool = False) -> dict:
    if not meta.exists():
        if missing_ok:
            return {"format": METADATA_FORMAT, "version": METADATA_VERSION, "files": {}}
        raise UsageError(f"missing {meta}; write token files with write_token_memmap or register_token_memmap")
    try:
        manifest = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"unreadable token metadata {meta}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != METADATA_FORMAT:
        raise UsageError(
            f"{meta} is not a {METADATA_FORMAT} manifest (no 'format': '{METADATA_FORMAT}'); "
            "describe the .bin files with register_token_memmap"
        )
    if manifest.get("version") != METADATA_VERSION:
        raise UsageError(f"{meta} has version {manifest.get('version')!r}; this code reads version {METADATA_VERSION}")
    if not isinstance(manifest.get("files"), dict):
        raise UsageError(f"{meta} has no 'files' table")
    return manifest


def _check_entry(entry: Any, bin_path: Path) -> dict:
    """Validate one file entry of the manifest; UsageError names the file."""
    where = f"metadata for {bin_path}"
    if not isinstance(entry, dict):
        raise UsageError(f"{where} is not an object")
    for key in ("dtype", "num_tokens", "vocab_size", "tokenizer"):
        if key not in entry:
            raise UsageError(f"{where} lacks '{key}'")
    if entry["dtype"] not in DTYPES:
        raise UsageError(f"{where} has dtype {entry['dtype']!r}; token files must be one of {', '.join(DTYPES)}")
    for key, low in (("num_tokens", 0), ("vocab_size", 1)):
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{where} has {key}={value!r}; it must be an integer >= {low}")
    capacity = 1 << (8 * DTYPES[entry["dtype"]].itemsize)
    if entry["vocab_size"] > capacity:
        raise UsageError(f"{where}: vocab_size {entry['vocab_size']} does not fit dtype {entry['dtype']}")
    if not isinstance(entry["tokenizer"], str) or not entry["tokenizer"]:
        raise UsageError(f"{where} has tokenizer={entry['tokenizer']!r}; it must be a non-empty name")
    if not isinstance(entry.get("extra", {}), dict):
        raise UsageError(f"{where} has a non-object 'extra'")
    return entry


def _new_entry(bin_path: Path, dtype: str, vocab_size: int, tokenizer: str, extra: dict | None) -> dict:
    entry = {"dtype": dtype, "num_tokens": 0, "vocab_size": vocab_size, "tokenizer": tokenizer,
             "extra": dict(extra or {})}
    return _check_entry(entry, bin_path)


def _record_entry(bin_path: Path, entry: dict) -> None:
    """Insert or replace the entry of `bin_path` in its directory's manifest, atomically."""
    meta = metadata_path(bin_path)
    with filelock.FileLock(str(meta.parent / f".{METADATA_NAME}.lock")):
        manifest = _read_manifest(meta, missing_ok=True)
        manifest["files"][bin_path.name] = entry
        manifest["files"] = dict(sorted(manifest["files"].items()))
        write_json(meta, manifest)


def _as_numpy_tokens(chunk: Any) -> np.ndarray:
    if isinstance(chunk, torch.Tensor):
        chunk = chunk.detach().cpu().numpy()
    arr = np.asarray(chunk)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise UsageError(f"token ids must be integers, got an array of {arr.dtype}")
    return arr.reshape(-1)


# --- writing --------------------------------------------------------------------------
class TokenMemmapWriter:
    """Streams token chunks into `path` (temp file, fsync, rename) and records its metadata.

    Use as a context manager; `append` checks every id against `vocab_size`. The file and
    its metadata entry appear only when the block exits without an exception.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        vocab_size: int,
        tokenizer: str = "unspecified",
        dtype: str | None = None,
        extra: dict | None = None,
    ):
        self.path = Path(path)
        dtype = dtype or default_dtype(int(vocab_size))
        self.entry = _new_entry(self.path, dtype, vocab_size, tokenizer, extra)
        try:
            json.dumps(self.entry)  # extra must be JSON: fail before writing anything
        except (TypeError, ValueError) as e:
            raise UsageError(f"metadata extra for {self.path} is not JSON: {e}") from None
        self.dtype = DTYPES[dtype]
        self.num_tokens = 0
        self._cm = None
        self._file = None

    def __enter__(self) -> "TokenMemmapWriter":
        self._cm = atomic_open(self.path, "wb")
        self._file = self._cm.__enter__()
        return self

    def append(self, tokens: Any) -> None:
        if self._file is None:
            raise UsageError("TokenMemmapWriter.append outside its `with` block")
        arr = _as_numpy_tokens(tokens)
        if arr.size == 0:
            return
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.entry["vocab_size"]:
            bad = lo if lo < 0 else hi
            raise UsageError(f"token id {bad} is outside [0, {self.entry['vocab_size']}) for {self.path}")
        self._file.write(memoryview(np.ascontiguousarray(arr, dtype=self.dtype)).cast("B"))
        self.num_tokens += int(arr.size)

    def __exit__(self, exc_type, exc, tb) -> bool:
        cm, self._file, self._cm = self._cm, None, None
        cm.__exit__(exc_type, exc, tb)  # renames into place only on success
        if exc_type is None:
            self.entry["num_tokens"] = self.num_tokens
            _record_entry(self.path, self.entry)
        return False


def write_token_memmap(
    path: str | os.PathLike,
    tokens: Any,
    vocab_size: int,
    tokenizer: str = "unspecified",
    dtype: str | None = None,
    extra: dict | None = None,
) -> "TokenMemmap":
    """Write `tokens` to `path` atomically: one integer array, tensor or list, or an iterator of chunks.

    dtype defaults to uint16 when vocab_size <= 65,536, else uint32. The entry for
    `path.name` is added to (or replaced in) `metadata.json` beside it. Returns the file
    opened as a `TokenMemmap`.
    """
    chunks: Iterable = [tokens] if isinstance(tokens, (np.ndarray, torch.Tensor, list, tuple)) else tokens
    with TokenMemmapWriter(path, vocab_size, tokenizer, dtype, extra) as writer:
        for chunk in chunks:
            writer.append(chunk)
    return TokenMemmap(path)


def register_token_memmap(
    path: str | os.PathLike, vocab_size: int, tokenizer: str, dtype: str, extra: dict | None = None
) -> "TokenMemmap":
    """Describe an existing .bin (e.g. a reference cache) in metadata.json without rewriting it.

    num_tokens is taken from the file size; every id is checked against vocab_size first.
    """
    path = Path(path)
    entry = _new_entry(path, dtype, vocab_size, tokenizer, extra)
    if not path.is_file():
        raise UsageError(f"missing token file {path}")
    size, itemsize = path.stat().st_size, DTYPES[dtype].itemsize
    if size % itemsize:
        raise UsageError(f"{path} has {size} bytes, not a whole number of {dtype} tokens")
    entry["num_tokens"] = size // itemsize
    _scan_range(_open_array(path, DTYPES[dtype], entry["num_tokens"]), vocab_size, path, full=True)
    _record_entry(path, entry)
    return TokenMemmap(path)


# --- reading --------------------------------------------------------------------------
def _open_array(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def _windows(n: int, full: bool) -> list[tuple[int, int]]:
    if full or n <= _SAMPLE_WINDOWS * _SAMPLE_WINDOW_TOKENS:
        return [(s, min(n, s + _CHUNK)) for s in range(0, n, _CHUNK)]
    starts = np.linspace(0, n - _SAMPLE_WINDOW_TOKENS, _SAMPLE_WINDOWS).astype(np.int64)
    return [(int(s), int(s) + _SAMPLE_WINDOW_TOKENS) for s in starts]


def _scan_range(tokens: np.ndarray, vocab_size: int, path: Path, full: bool) -> None:
    for start, stop in _windows(len(tokens), full):
        window = np.asarray(tokens[start:stop])
        if window.size and int(window.max()) >= vocab_size:
            at = start + int(np.argmax(window >= vocab_size))
            raise UsageError(f"{path}: token id {int(tokens[at])} at position {at} is >= vocab_size {vocab_size}")


class TokenMemmap:
    """A read-only token file with its validated metadata.

    `tokens` is an `np.memmap` (mode "r"); `read(start, length)` returns int64. Opening
    checks dtype, size against num_tokens, and ids against vocab_size on 16 windows of
    65,536 tokens spread over the file (the whole file when it is smaller); pass
    `check=False` to skip the id sample, or call `validate(full=True)` for a full scan.
    """

    def __init__(self, path: str | os.PathLike, check: bool = True):
        self.path = Path(path)
        meta = metadata_path(self.path)
        manifest = _read_manifest(meta)
        if self.path.name not in manifest["files"]:
            raise UsageError(f"{meta} has no entry for {self.path.name}")
        entry = _check_entry(manifest["files"][self.path.name], self.path)
        if not self.path.is_file():
            raise UsageError(f"missing token file {self.path} (listed in {meta})")
        self.dtype = DTYPES[entry["dtype"]]
        self.num_tokens: int = entry["num_tokens"]
        self.vocab_size: int = entry["vocab_size"]
        self.tokenizer: str = entry["tokenizer"]
        self.extra: dict = dict(entry.get("extra", {}))
        size = self.path.stat().st_size
        if size != self.num_tokens * self.dtype.itemsize:
            raise UsageError(
                f"{self.path} has {size} bytes but metadata says {self.num_tokens} {entry['dtype']} tokens "
                f"({self.num_tokens * self.dtype.itemsize} bytes)"
            )
        self.tokens = _open_array(self.path, self.dtype, self.num_tokens)
        if check:
            self.validate(full=False)

    def validate(self, full: bool = True) -> None:
        """Check ids < vocab_size: every token (full) or the sampled windows."""
        _scan_range(self.tokens, self.vocab_size, self.path, full)

    def __len__(self) -> int:
        return self.num_tokens

    def read(self, start: int, length: int) -> np.ndarray:
        """tokens[start : start + length] as int64; UsageError past the end."""
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise UsageError(f"{self.path}: [{start}, {start + length}) is outside its {self.num_tokens} tokens")
        return np.asarray(self.tokens[start : start + length], dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"TokenMemmap({str(self.path)!r}, dtype={self.dtype.name}, num_tokens={self.num_tokens}, "
            f"vocab_size={self.vocab_size}, tokenizer={self.tokenizer!r})"
        )


def open_memmap(source: "TokenMemmap | str | os.PathLike") -> TokenMemmap:
    return source if isinstance(source, TokenMemmap) else TokenMemmap(source)


def count_blocks(memmap: "TokenMemmap | str | os.PathLike", block_len: int, with_target: bool = True) -> int:
    """Blocks available: (N - 1) // block_len with a target token, N // block_len without."""
    if block_len < 1:
        raise UsageError(f"block_len must be >= 1, got {block_len}")
    n = len(open_memmap(memmap))
    return max(0, n - 1) // block_len if with_target else n // block_len


# --- loaders --------------------------------------------------------------------------
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


# --- T5 prefix-to-continuation ----------------------------------------------------------
def split_prefix_continuation(
    windows: torch.Tensor, src_len: int, tgt_len: int, bos: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, tgt_in, tgt) of windows [B, src_len + tgt_len]: tgt_in = [bos, tgt[:-1]]."""
    src = windows[:, :src_len]
    tgt = windows[:, src_len : src_len + tgt_len]
    start = torch.full((windows.shape[0], 1), int(bos), dtype=windows.dtype, device=windows.device)
    return src, torch.cat([start, tgt[:, :-1]], dim=1), tgt


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


class PrefixContinuationLoader(BlockLoaderView):
    """Seed 004 small-T5 batches (spec §3 row 5): (src, tgt_in, tgt), int64 [B, 256] each.

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
