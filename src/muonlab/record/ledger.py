"""The run ledger: append-only JSON Lines, one object per finished, failed or interrupted run.

A line is strict JSON: a non-finite number (a diverged run's NaN loss, a cap of inf) is written as the
string float() reads back ("nan", "inf") and named under `non_finite`. An append takes an exclusive
file lock, writes the whole line (in as many writes as it takes: see atomic.WRITE_CHUNK) and fsyncs,
so concurrent writers never interleave or tear lines, and a failed write (a full disk) is cut back
under the lock, leaving no partial record.

Statuses: `ok`; `failed`; `diverged`; `interrupted` (Ctrl-C, SIGTERM, a preemption: not ok,
and continued by the next sweep from its checkpoint when the record says `resumable`).
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from muonlab.atomic import append_whole, nearest_existing, writable_error
from muonlab.errors import CorruptInput, MuonlabError, UsageError

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


def strict_json(record: dict[str, Any]) -> dict[str, Any]:
    """The record with every non-finite float as the string Python's float() reads back ("nan", "inf",
    "-inf": a diverged run's loss, K.7's cap c = inf in its config), their dotted paths listed under
    `non_finite`, so the line is strict JSON (no NaN / Infinity tokens). A config reads "inf" back as
    the number; a metric that is a string is no number to the report (metric_value)."""
    found: list[str] = []

    def clean(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            found.append(f"{where}={value}")
            return str(value)
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(record, "")
    if found:
        out["non_finite"] = found
    return out


def append_line(path: str | os.PathLike, record: dict[str, Any], what: str = "the file") -> None:
    """Append one JSON object as one whole, strict-JSON line, under the file's lock (see the module note)."""
    path = Path(path)
    line = json.dumps(strict_json(record), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
    data = line.encode()
    try:  # a folder, lock or file that cannot be written (read-only, a full disk) is the append failing
        path.parent.mkdir(parents=True, exist_ok=True)
        # the lock also guards the cut-back of a failed write: the size it returns to is still the end
        with FileLock(str(path) + ".lock"):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as open() does
            try:
                append_whole(fd, data, sync=True)
            finally:
                os.close(fd)
    except OSError as exc:
        raise MuonlabError(f"could not append to {what} {path}: {exc}") from exc


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
    _refuse_a_directory(path)
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


def _refuse_a_directory(path: Path) -> None:
    if path.is_dir():
        raise MuonlabError(f"the ledger {path} is a directory; give the ledger file (--ledger) or another --runs-dir")


PENDING = "ledger_line.json"  # in a run directory: the line its ledger did not take (muonlab ledger recover)


def check_writable(path: str | os.PathLike) -> None:
    """Refuse (MuonlabError, one line) a ledger this process cannot append to: checked before a run
    trains, so a finished run is not lost to a read-only or misplaced ledger. The file and its lock
    file (in the same folder) are both tried."""
    path = Path(path)
    _refuse_a_directory(path)
    error = writable_error(path)
    if error is not None and path.exists():
        raise MuonlabError(f"the ledger {path} is not writable: nothing was run ({error.strerror}; make it writable, "
                           f"or give another --runs-dir)")
    error = error or writable_error(path.with_name(path.name + ".lock"))
    if error is not None:  # named as the nearest folder that exists: where a ledger still to come would go
        raise MuonlabError(f"cannot write the ledger's folder {nearest_existing(path.parent)}: nothing was run "
                           f"({error.strerror}; give another --runs-dir)")


def recover(runs_dir: str | os.PathLike, ledger: str | os.PathLike | None = None) -> list[str]:
    """Append to the ledger the lines its run directories kept when the ledger refused them
    (`ledger_line.json`), each once: a run whose id the ledger already holds is not appended again.
    A recovered run directory's file becomes `ledger_line.recovered.json`. Returns the run ids appended."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise UsageError(f"{runs_dir} is not a runs directory (give the folder that holds the run directories)")
    ledger = Path(ledger) if ledger else runs_dir / "ledger.jsonl"
    check_writable(ledger)
    have = {r.get("run_id") for r in read_records_tolerant(ledger)[0]}
    appended = []
    for pending in sorted(runs_dir.glob(f"*/{PENDING}")):
        try:
            record = json.loads(pending.read_text())
        except (OSError, ValueError) as exc:
            raise CorruptInput(f"{pending} is not a ledger line ({exc}): repair or remove it, then recover "
                               "again") from None
        if record.get("run_id") not in have:
            append_record(ledger, record)
            appended.append(record.get("run_id"))
        os.replace(pending, pending.with_name("ledger_line.recovered.json"))
    return appended
