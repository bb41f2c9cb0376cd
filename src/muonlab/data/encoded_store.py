"""Token ids of a small corpus's document batches, kept on disk beside the tokenizer.

The best-fit packer fills a buffer of 1,000 documents before its first row (upstream's), so every run of a small
corpus tokenizes most of it again: about a quarter of a CPU second for the 200 KB synthetic corpus, as long as
a whole miniature step. Here each document batch's ids are stored once, under the hash of the tokenizer and of
the batch's text, and read back by every later run: the same ids, so the same rows, losses and resumes. Only
splits up to `data.encoded_store_mb` are stored (ClimbMix's shards are tokenized as they are read, as upstream).
A file that cannot be read or does not fit its batch is encoded again and replaced; one that cannot be written
leaves the run to tokenize (a read-only cache)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from muonlab.atomic import atomic_open
from muonlab.data.store import hash_docs

FORMAT = 1  # the layout of an entry: [FORMAT, n, offsets (n + 1), ids]; bumped when it changes


class EncodedStore:
    """Document batch -> its documents' ids (BOS first), one .npy file a batch under `directory`."""

    def __init__(self, directory: Path, tokenizer_fingerprint: str):
        self.directory = Path(directory)
        self.fingerprint = tokenizer_fingerprint

    def _path(self, docs: list[str]) -> Path:
        h = hashlib.sha256(f"{FORMAT}:{self.fingerprint}:{len(docs)}:".encode())
        hash_docs(h, docs)  # length-prefixed, as the corpus hash: no two batches hash alike by moving a boundary
        return self.directory / f"{h.hexdigest()[:32]}.npy"

    def read(self, docs: list[str]) -> tuple[Path, list[np.ndarray] | None]:
        """(where the ids of `docs` are kept, the ids read from there or None where they are not)."""
        path = self._path(docs)
        return path, _read(path, len(docs))

    @staticmethod
    def write(path: Path, rows: list[list[int]]) -> None:
        """Keep the ids `rows` (lists of ids, BOS first, one a document) at `path`."""
        lengths = [len(r) for r in rows]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        ids = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(offsets[-1]))
        entry = np.concatenate([np.array([FORMAT, len(rows)], dtype=np.int32), offsets.astype(np.int32), ids])
        try:
            with atomic_open(path, "wb") as f:
                np.save(f, entry, allow_pickle=False)
        except OSError:  # a cache the run may not write: it tokenizes, as without a store
            pass


def _read(path: Path, n: int) -> list[np.ndarray] | None:
    try:
        entry = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # absent, or not a whole .npy file
        return None
    if entry.dtype != np.int32 or entry.ndim != 1 or entry.size < n + 3 or entry[0] != FORMAT or entry[1] != n:
        return None
    offsets, ids = entry[2:n + 3].astype(np.int64), entry[n + 3:]
    if offsets[0] != 0 or offsets[-1] != ids.size or np.any(np.diff(offsets) < 0):
        return None
    return [ids[a:b] for a, b in zip(offsets[:-1], offsets[1:])]

