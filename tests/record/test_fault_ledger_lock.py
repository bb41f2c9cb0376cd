"""Concurrent ledger writers, through the project's own writer, with records of several write chunks.

One O_APPEND write of a whole line does not interleave with others on a local Linux disk, so a
test with one-write lines passes without the lock. The writer goes out in chunks of
atomic.WRITE_CHUNK (a write may be partial anyway, and open(2): "O_APPEND may lead to corrupted
files on NFS filesystems if more than one process appends data to a file at once"), so a record
larger than a chunk stays whole only because its writer holds the lock from first byte to last.
Children are spawned: this module must stay light to import (no torch).
"""

import contextlib
import multiprocessing as mp
import os

import pytest

import muonlab.record.ledger as ledger
from muonlab.atomic import WRITE_CHUNK
from muonlab.record.ledger import append_record, read_records_tolerant

BLOB = 5 * WRITE_CHUNK  # each record needs six writes


def record(writer: int, i: int) -> dict:
    return {"run_id": f"{writer}-{i}", "arm": "a", "seed": i, "status": "ok", "blob": "abcdefgh"[writer] * BLOB}


def _append_many(path, writer: int, count: int, start) -> None:
    start.wait()  # all writers at once, not one after another as their imports finish
    for i in range(count):
        append_record(path, record(writer, i))


def test_concurrent_multi_chunk_appends_stay_whole(tmp_path):
    path = tmp_path / "ledger.jsonl"
    writers, count = 4, 24
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(writers)
    procs = [ctx.Process(target=_append_many, args=(path, w, count, start)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    records, problems = read_records_tolerant(path)
    assert problems == []  # no torn or interleaved line
    assert sorted(r["run_id"] for r in records) == sorted(f"{w}-{i}" for w in range(writers) for i in range(count))
    assert all(r["blob"] == "abcdefgh"[int(r["run_id"].split("-")[0])] * BLOB for r in records)


def _append_pausing_mid_record(path, remove_lock: bool, mid_write, probed) -> None:
    """Append one record, stopping after its first chunk until the parent has probed the lock."""
    if remove_lock:  # the mutation the probe must notice
        ledger.FileLock = lambda _path: contextlib.nullcontext()
    real_write = os.write

    def write(fd, data):
        written = real_write(fd, data)
        if not mid_write.is_set() and os.path.samestat(os.fstat(fd), os.stat(path)):
            mid_write.set()
            assert probed.wait(60), "the parent never probed"
        return written

    os.write = write  # this child's own os module
    append_record(path, record(0, 0))


@pytest.mark.parametrize("remove_lock", [False, True], ids=["writer", "writer-without-lock"])
def test_lock_is_held_from_first_chunk_to_last(tmp_path, remove_lock):
    from filelock import FileLock, Timeout

    path = tmp_path / "ledger.jsonl"
    ctx = mp.get_context("spawn")
    mid_write, probed = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_append_pausing_mid_record, args=(path, remove_lock, mid_write, probed))
    child.start()
    try:
        assert mid_write.wait(60), "the writer never started"
        assert 0 < path.stat().st_size < BLOB and not path.read_bytes().endswith(b"\n")  # half a line
        probe = FileLock(str(path) + ".lock")
        try:
            probe.acquire(timeout=0)
            held = False
            probe.release()
        except Timeout:
            held = True
    finally:
        probed.set()
        child.join(timeout=60)
    assert child.exitcode == 0
    assert held is not remove_lock  # the probe tells a locked writer from an unlocked one
    records, problems = read_records_tolerant(path)
    assert problems == [] and [r["run_id"] for r in records] == ["0-0"]


def test_a_torn_line_of_digits_is_reported_not_raised(tmp_path):
    """Interleaved chunks can leave a line that is one long number, which json refuses to convert
    with a ValueError of its own, not a JSONDecodeError."""
    path = tmp_path / "ledger.jsonl"
    append_record(path, record(0, 0))
    with open(path, "a") as f:
        f.write("7" * 5000 + "\n")
    records, problems = read_records_tolerant(path)
    assert [r["run_id"] for r in records] == ["0-0"] and len(problems) == 1 and problems[0].startswith("line 2:")
