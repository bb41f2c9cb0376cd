"""Small in-memory corpora (local, stdlib, synthetic) and their split by document.

A source lists `(doc_id, text)` pairs in a deterministic order and gives a cheap
`identity()` that decides its cache directory. The split ranks documents by
sha256(salt + doc_id), a seedless deterministic shuffle that does not depend on
machine or file order: the first round(n * val_fraction) documents are val, the
next round(n * holdout_fraction) holdout, the rest train (at least one each).
Within a split documents keep that hashed order, so the training stream is mixed
rather than, say, alphabetical by module.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from muonlab.data.config import DataConfig
from muonlab.data.local_source import LocalSource
from muonlab.data.stdlib_source import StdlibSource
from muonlab.data.synthetic import SyntheticSource
from muonlab.errors import UsageError

SPLITS = ("train", "val", "holdout")
SPLIT_SCHEME = "sha256-rank-v1"
_SALT = b"muonlab-split-v1\0"


class SmallSource(Protocol):
    name: str

    def identity(self) -> dict: ...

    def documents(self) -> list[tuple[str, str]]: ...

    def meta(self) -> dict: ...


def make_source(cfg: DataConfig) -> SmallSource:
    if cfg.source == "stdlib":
        return StdlibSource()
    if cfg.source == "local":
        return LocalSource(cfg.path, cfg.local_txt_docs)
    if cfg.source == "synthetic":
        return SyntheticSource(
            cfg.synthetic_bytes,
            cfg.synthetic_seed,
            cfg.synthetic_words,
            cfg.synthetic_branching,
            cfg.synthetic_doc_words,
        )
    raise UsageError(f"{cfg.source!r} is not a small in-memory source")


def _rank_key(doc_id: str) -> bytes:
    return hashlib.sha256(_SALT + doc_id.encode("utf-8")).digest()


def rank_prefix(doc_id: str) -> int:
    """The first 8 bytes of a document's rank key as an integer: the same order as the key unless two
    of n documents share 64 bits (probability about n**2 / 2**65: 7e-5 at UniRef50's 48M records)."""
    return int.from_bytes(_rank_key(doc_id)[:8], "big")


def split_sizes(n: int, val_fraction: float, holdout_fraction: float, hint: str = "") -> tuple[int, int]:
    """(val, holdout) document counts of a corpus of n documents; UsageError when a split would be empty."""
    if n == 0:
        raise UsageError(f"the corpus is empty{hint}")
    n_val = max(1, round(n * val_fraction))
    n_holdout = max(1, round(n * holdout_fraction))
    if n - n_val - n_holdout < 1:
        raise UsageError(f"the corpus has only {n} document(s); need at least 3 (one per split){hint}")
    return n_val, n_holdout


def split_documents(
    docs: list[tuple[str, str]], val_fraction: float, holdout_fraction: float, hint: str = ""
) -> dict[str, list[str]]:
    """Split documents into disjoint train/val/holdout text lists; UsageError if too few."""
    n_val, n_holdout = split_sizes(len(docs), val_fraction, holdout_fraction, hint)
    ranked = sorted(docs, key=lambda d: (_rank_key(d[0]), d[0]))
    texts = [text for _, text in ranked]
    return {
        "val": texts[:n_val],
        "holdout": texts[n_val : n_val + n_holdout],
        "train": texts[n_val + n_holdout :],
    }


def chunk_document(text: str, max_chars: int) -> list[str]:
    """Cut `text` into pieces of at most `max_chars`, at line ends where possible.

    A piece ends at its last blank line if that is past half of `max_chars`, else at its
    last line end; a single line longer than `max_chars` is cut mid-line. Joining the
    pieces gives back `text` exactly.
    """
    pieces: list[str] = []
    start, n = 0, len(text)
    while n - start > max_chars:
        limit = start + max_chars
        cut = text.rfind("\n\n", start, limit - 1) + 2  # just after a blank line
        if cut - start <= max_chars // 2:
            cut = text.rfind("\n", start, limit) + 1  # just after a line end
        if cut <= start:
            cut = limit
        pieces.append(text[start:cut])
        start = cut
    if start < n:
        pieces.append(text[start:])
    return pieces


def chunk_documents(texts: list[str], max_chars: int | None) -> list[str]:
    if max_chars is None:
        return texts
    return [piece for text in texts for piece in chunk_document(text, max_chars)]
