"""Documents on disk: parquet files with a `text` column, read back in batches of 128.

Batches never straddle a row group, as upstream, so the packed row stream over a
ClimbMix shard is the same whether read here or by upstream's loader. A batch can be
addressed by its index, which makes resuming a loader cheap: whole row groups are
skipped from the file metadata without reading their text.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from muonlab.atomic import atomic_open
from muonlab.errors import CorruptInput, MuonlabError, UsageError

DOC_BATCH = 128  # documents tokenized together (upstream's tokenizer batch)
ROW_GROUP = 1024  # multiple of DOC_BATCH, so stored splits batch like one long list


class DocBatch(NamedTuple):
    """A batch of documents and the 1-based pass over the split it came from."""

    docs: list[str]
    epoch: int = 1


def write_docs(path: str | os.PathLike, docs: Sequence[str]) -> None:
    """Write documents as a parquet file with one `text` column, atomically."""
    table = pa.table({"text": pa.array(list(docs), type=pa.string())})
    with atomic_open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=ROW_GROUP, compression="zstd")


def open_parquet(path: Path) -> pq.ParquetFile:
    """Open a parquet file that must have a `text` column; MuonlabError names a bad file."""
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise UsageError(f"missing data file {path}; prepare the data again") from None
    except (pa.ArrowException, OSError) as e:
        raise CorruptInput(f"corrupted parquet file {path}: {e}") from None
    if "text" not in pf.schema_arrow.names:
        raise MuonlabError(f"parquet file {path} has no 'text' column")
    return pf


def _batches_per_group(pf: pq.ParquetFile, batch_size: int) -> list[int]:
    meta = pf.metadata
    return [-(-meta.row_group(i).num_rows // batch_size) for i in range(meta.num_row_groups)]


def count_batches(paths: Sequence[Path], batch_size: int = DOC_BATCH) -> int:
    return sum(sum(_batches_per_group(open_parquet(p), batch_size)) for p in paths)


def _read_group(pf: pq.ParquetFile, path: Path, index: int) -> list[str]:
    try:
        column = pf.read_row_group(index, columns=["text"]).column("text")
    except (pa.ArrowException, OSError) as e:
        raise CorruptInput(f"corrupted parquet file {path} (row group {index}): {e}") from None
    return [t if t is not None else "" for t in column.to_pylist()]


def _one_pass(paths: Sequence[Path], skip: int, batch_size: int) -> Iterator[list[str]]:
    for path in paths:
        pf = open_parquet(path)
        for g, n in enumerate(_batches_per_group(pf, batch_size)):
            if skip >= n:  # skip a whole row group without reading it
                skip -= n
                continue
            docs = _read_group(pf, path, g)
            for b in range(skip, n):
                yield docs[b * batch_size : (b + 1) * batch_size]
            skip = 0


def iter_doc_batches(
    paths: Sequence[Path], start: int = 0, cycle: bool = False, batch_size: int = DOC_BATCH
) -> Iterator[DocBatch]:
    """Batches of documents from `paths` in order, beginning at batch index `start`.

    With `cycle`, passes repeat forever and `epoch` counts them from 1; `start` then
    counts batches across passes.
    """
    if not cycle:
        for docs in _one_pass(paths, start, batch_size):
            yield DocBatch(docs, 1)
        return
    per_pass = count_batches(paths, batch_size)
    if per_pass == 0:
        raise UsageError("the training split has no documents")
    epoch, skip = divmod(start, per_pass)
    epoch += 1
    while True:
        for docs in _one_pass(paths, skip, batch_size):
            yield DocBatch(docs, epoch)
        skip = 0
        epoch += 1


def iter_docs(paths: Sequence[Path]) -> Iterator[str]:
    for batch in iter_doc_batches(paths):
        yield from batch.docs


class SplitStats(NamedTuple):
    docs: int
    bytes: int
    chars: int


def hash_docs(h: "hashlib._Hash", docs: Iterable[str]) -> SplitStats:
    """Feed documents into `h` unambiguously (length-prefixed); return their counts."""
    n = nbytes = nchars = 0
    for doc in docs:
        data = doc.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
        n += 1
        nbytes += len(data)
        nchars += len(doc)
    return SplitStats(n, nbytes, nchars)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
