"""The run ledger: append-only JSON Lines, one object per finished or failed run.

Appends take an exclusive file lock and write the whole line with one `write` followed by
fsync, so concurrent writers never interleave or tear lines, and a reader never sees a
partial record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from muonlab.errors import MuonlabError

STATUSES = ("ok", "failed", "diverged")


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    path = Path(path)
    if record.get("status") not in STATUSES:
        raise ValueError(f"ledger status must be one of {STATUSES}, got {record.get('status')!r}")
    line = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = line.encode()
    with FileLock(str(path) + ".lock"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):  # a full disk can accept part of a line
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
                os.fsync(fd)
            except OSError as exc:
                os.ftruncate(fd, size)  # never leave a torn line behind
                raise MuonlabError(f"could not append to the ledger {path}: {exc}") from exc
        finally:
            os.close(fd)


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not a JSON ledger line") from exc


def read_records_tolerant(path: str | os.PathLike, validate=None) -> tuple[list[dict[str, Any]], list[str]]:
    """All usable records, and one message per unusable line ("line N: why"); never silent.

    `validate(record) -> str | None` may reject parsed records with a reason. Each kept record
    gets `_line`, its 1-based line number.
    """
    path = Path(path)
    records, problems = [], []
    if not path.exists():
        return records, problems
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})")
                continue
            issue = (f"not a JSON object (got {type(rec).__name__})" if not isinstance(rec, dict)
                     else validate(rec) if validate else None)
            if issue:
                problems.append(f"line {lineno}: {issue}")
                continue
            records.append({**rec, "_line": lineno})
    return records, problems
