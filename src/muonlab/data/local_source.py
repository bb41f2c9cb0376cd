"""The `local` corpus: a file or a folder of .txt, .jsonl and .parquet files.

Files are read in sorted relative-path order (hidden files and folders skipped).
A .jsonl line or a parquet row is one document, taken from its `text` field/column.
A .txt file is one document (`local_txt_docs="file"`), or one document per
paragraph separated by blank lines (`"paragraph"`), which suits a single long text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from muonlab.errors import CorruptInput, UsageError

EXTENSIONS = (".txt", ".jsonl", ".parquet")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")


def local_files(path: str | Path) -> tuple[Path, list[Path]]:
    """(base folder, sorted corpus files relative to it); UsageError if there are none."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"corpus path {path} does not exist")
    if path.is_file():
        if path.suffix not in EXTENSIONS:
            raise UsageError(f"corpus file {path} is not .txt, .jsonl or .parquet")
        return path.parent, [Path(path.name)]
    files = [
        p.relative_to(path)
        for p in path.rglob("*")
        if p.is_file() and p.suffix in EXTENSIONS
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]
    if not files:
        raise UsageError(f"no .txt, .jsonl or .parquet files under {path}")
    return path, sorted(files, key=lambda p: p.as_posix())


def _read_txt(path: Path, rel: str, mode: str) -> list[tuple[str, str]]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if mode == "file":
        return [(rel, text)] if text else []
    paragraphs = [p.strip("\n") for p in _PARAGRAPH_BREAK.split(text)]
    return [(f"{rel}#{i}", p) for i, p in enumerate(paragraphs) if p.strip()]


def _read_jsonl(path: Path, rel: str) -> list[tuple[str, str]]:
    docs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            text = obj.get("text") if isinstance(obj, dict) else None
            if not isinstance(text, str):
                raise UsageError(f"{path}:{lineno}: no string field 'text'")
            if text:
                docs.append((f"{rel}:{lineno}", text))
    return docs


def _read_parquet(path: Path, rel: str) -> Iterator[tuple[str, str]]:
    """(id, text) of each non-empty `text` row, a row group at a time (a FineWeb shard is 2 GB)."""
    try:
        pf = pq.ParquetFile(path)
        if "text" not in pf.schema_arrow.names:
            raise UsageError(f"{path} has no 'text' column")
        row = 0
        for g in range(pf.num_row_groups):
            texts = pf.read_row_group(g, columns=["text"]).column("text").to_pylist()
            for i, t in enumerate(texts, row):
                if isinstance(t, str) and t:
                    yield f"{rel}:{i}", t
            row += len(texts)
    except (pa.ArrowException, OSError) as e:
        raise CorruptInput(f"corrupted parquet file {path}: {e}") from None


class LocalSource:
    name = "local"

    def __init__(self, path: str | Path, txt_docs: str = "file"):
        self.base, self.files = local_files(path)
        self.path = Path(path).expanduser().resolve()
        self.txt_docs = txt_docs

    def identity(self) -> dict:
        # Path, names, sizes and modification times: editing a file rebuilds the corpus.
        listing = hashlib.sha256()
        for rel in self.files:
            st = (self.base / rel).stat()
            listing.update(f"{rel.as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return {"path": str(self.path), "txt_docs": self.txt_docs, "files": listing.hexdigest()}

    def iter_documents(self) -> Iterator[tuple[str, str]]:
        """(id, text) of every non-empty document, file by file (a parquet row group at a time)."""
        for rel in self.files:
            path, key = self.base / rel, rel.as_posix()
            if rel.suffix == ".txt":
                yield from _read_txt(path, key, self.txt_docs)
            elif rel.suffix == ".jsonl":
                yield from _read_jsonl(path, key)
            else:
                yield from _read_parquet(path, key)

    def documents(self) -> list[tuple[str, str]]:
        docs = list(self.iter_documents())
        if not docs:
            raise UsageError(f"corpus at {self.path} has no non-empty documents")
        return docs

    def meta(self) -> dict:
        return {"path": str(self.path), "files": len(self.files), "txt_docs": self.txt_docs}
