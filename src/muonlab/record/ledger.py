"""The run ledger: append-only JSON Lines, one object per finished, failed or interrupted run.

An append takes an exclusive file lock, writes the whole line (in as many writes as it takes:
see atomic.WRITE_CHUNK) and fsyncs, so concurrent writers never interleave or tear lines, and
a failed write (a full disk) is cut back under the lock, leaving no partial record.

Statuses: `ok`; `failed`; `diverged`; `interrupted` (Ctrl-C, SIGTERM, a preemption: not ok,
and continued by the next sweep from its checkpoint when the record says `resumable`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from muonlab.atomic import append_whole
from muonlab.errors import MuonlabError

STATUSES = ("ok", "failed", "diverged", "interrupted")
STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # a line's finished_at: local time with its UTC offset, whole seconds


def finished_time(record: dict[str, Any]) -> datetime | None:
    """When the run of a ledger line ended (its finished_at, offset-aware), or None without one."""
    try:
        return datetime.strptime(str(record.get("finished_at")), STAMP_FORMAT)
    except ValueError:
        return None


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    if record.get("status") not in STATUSES:
        raise ValueError(f"ledger status must be one of {STATUSES}, got {record.get('status')!r}")
    append_line(path, record, what="the ledger")


def append_line(path: str | os.PathLike, record: dict[str, Any], what: str = "the file") -> None:
    """Append one JSON object as one whole line, under the file's lock (see the module note)."""
    path = Path(path)
    line = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = line.encode()
    # the lock also guards the cut-back of a failed write: the size it returns to is still the end
    with FileLock(str(path) + ".lock"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as open() creates files
        try:
            append_whole(fd, data, sync=True)
        except OSError as exc:
            raise MuonlabError(f"could not append to {what} {path}: {exc}") from exc
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
                except ValueError as exc:  # JSONDecodeError, or a number too long to convert
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
            except ValueError as exc:  # e.g. a torn line that leaves a number too long to convert
                problems.append(f"line {lineno}: not valid JSON ({exc})")
                continue
            issue = (f"not a JSON object (got {type(rec).__name__})" if not isinstance(rec, dict)
                     else validate(rec) if validate else None)
            if issue:
                problems.append(f"line {lineno}: {issue}")
                continue
            records.append({**rec, "_line": lineno})
    return records, problems
