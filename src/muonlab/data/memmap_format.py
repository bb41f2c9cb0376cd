"""The token-memmap file format of seed paper 004 (AF-Muon, released code; seed 004 §3.1 says only 'token cache').

Seed 004 trains from pre-tokenized caches: one flat little-endian array of token ids per
split (uint16 when the vocabulary fits, else uint32) next to a `metadata.json`. This module
writes, registers, opens and validates such files; the loaders that batch them are in
`muonlab.data.loaders`.

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
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
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
