"""A document collection too large for memory (UniRef50 2021_04: 48M records) split into train / val /
holdout token files, streamed: the same split and the same order as `sources.split_documents`
(documents ranked by the hash of their ids; the first val_fraction val, the next holdout, the rest
train, each in rank order), without holding the documents.

One pass encodes each document into a staging token file and keeps only its 64-bit rank prefix and
token count (12 bytes a document; with the sort, about 30 bytes a document at the peak: 1.4 GB at
48M records, where the sequences alone are 14 GB of text). The split files are then copied out of the
staging file in rank order, a few million tokens at a time, and the staging folder is removed.
"""

from __future__ import annotations

import shutil
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from muonlab.data.memmap_format import TokenMemmap, TokenMemmapWriter, default_dtype
from muonlab.data.sources import rank_prefix, split_sizes
from muonlab.errors import UsageError

SPLIT_ORDER = ("train", "val", "holdout")
STAGING = ".staging"


def _encode_into(writer: TokenMemmapWriter, documents: Iterable[tuple[str, str]],
                 encode: Callable[[list[str]], Iterable[list[int]]], batch: int) -> tuple[array, array]:
    keys, counts = array("Q"), array("I")
    ids: list[str] = []
    texts: list[str] = []

    def flush() -> None:
        for doc_id, tokens in zip(ids, encode(texts), strict=True):
            keys.append(rank_prefix(doc_id))
            counts.append(len(tokens))
            writer.append(tokens)
        ids.clear()
        texts.clear()

    for doc_id, text in documents:
        ids.append(doc_id)
        texts.append(text)
        if len(ids) == batch:
            flush()
    if ids:
        flush()
    return keys, counts


def _copy_in_order(out: TokenMemmapWriter, tokens: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                   chunk_tokens: int) -> None:
    """Append the documents [starts[i], starts[i] + counts[i]) of `tokens`, in the given order."""
    ends = np.cumsum(counts)
    a = 0
    while a < len(counts):
        done = int(ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(ends, done + chunk_tokens, side="right")))
        s, n = starts[a:b], counts[a:b]
        offsets = np.cumsum(n) - n
        positions = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(s - offsets, n)
        out.append(tokens[positions])
        a = b


def write_ranked_splits(folder: Path, documents: Iterable[tuple[str, str]],
                        encode: Callable[[list[str]], Iterable[list[int]]], vocab_size: int, tokenizer: str,
                        val_fraction: float, holdout_fraction: float, extra: dict, hint: str = "",
                        batch: int = 256, chunk_tokens: int = 1 << 22) -> list[str]:
    """folder/{train,val,holdout}.bin of `documents` ((id, text) pairs, read once), each document
    encoded by `encode(texts) -> token lists`; returns the split names."""
    dtype = default_dtype(vocab_size)
    staging = folder / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted write left
    try:
        with TokenMemmapWriter(staging / "all.bin", vocab_size, tokenizer, dtype, extra) as writer:
            keys, counts = _encode_into(writer, documents, encode, batch)
        n_val, n_holdout = split_sizes(len(keys), val_fraction, holdout_fraction, hint)
        order = np.argsort(np.frombuffer(keys, dtype=np.uint64), kind="stable")  # ties keep file order
        del keys
        count = np.frombuffer(counts, dtype=np.uint32).astype(np.int64)
        starts = np.cumsum(count) - count
        parts = {"val": order[:n_val], "holdout": order[n_val:n_val + n_holdout], "train": order[n_val + n_holdout:]}
        tokens = TokenMemmap(staging / "all.bin", check=False).tokens
        for split in SPLIT_ORDER:
            idx = parts[split]
            with TokenMemmapWriter(folder / f"{split}.bin", vocab_size, tokenizer, dtype, extra) as out:
                _copy_in_order(out, tokens, starts[idx], count[idx], chunk_tokens)
            if out.num_tokens == 0:
                raise UsageError(f"the {split} split has no tokens ({folder})")
        del tokens
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return list(SPLIT_ORDER)
