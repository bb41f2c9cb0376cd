"""Files a team can share: everything muonlab writes is created with the process umask (0666 less it, as
`open` creates files), atomically or not: 0644 under 022, 0664 under a team's 002."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from muonlab.atomic import append_whole, atomic_open, write_json
from muonlab.cli import main


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root) -> dict[str, str]:
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_and_appended_files_take_the_umask(mask, mode, tmp_path):
    with umask(mask):
        write_json(tmp_path / "a.json", {"x": 1})
        with atomic_open(tmp_path / "b.pt", "wb") as f:
            f.write(b"\0")
        fd = os.open(tmp_path / "c.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        append_whole(fd, b"{}\n")
        os.close(fd)
    assert modes(tmp_path) == {name: oct(mode) for name in ("a.json", "b.pt", "c.jsonl")}
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left beside them


def test_every_kind_of_file_a_run_a_sweep_prepare_and_report_write_is_0644_under_umask_022(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MUONLAB_CACHE", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with umask(0o022):
        assert main(["prepare", "--preset", "cpu-tiny"]) == 0
        assert main(["train", "--preset", "cpu-tiny", "--num-steps", "4", "--checkpoint-every", "2"]) == 0
        assert main(["sweep", "--arms", "baseline,adamw_only", "--seeds", "1", "--preset", "cpu-tiny",
                     "--num-steps", "2"]) == 0
        assert main(["report", "--ledger", str(cache / "runs" / "ledger.jsonl"), "--out", str(tmp_path / "report"),
                     "--tsv", str(tmp_path / "results.tsv")]) == 0
    found = modes(tmp_path)
    kinds = {name.rsplit(".", 1)[-1] for name in found}
    # config/summary/report JSON, metrics and the ledger, weights and checkpoints, the corpus, the tokenizer
    # (JSON), the report's text and figures, results.tsv, the sweep's job files and logs
    assert {"json", "jsonl", "pt", "parquet", "md", "png", "tsv", "log"} <= kinds, sorted(kinds)
    assert any("ckpt" in name or "checkpoint" in name for name in found), sorted(found)
    assert any(name.endswith("muonlab-bpe.json") for name in found), sorted(found)
    wrong = {name: mode for name, mode in found.items() if mode != oct(0o644)}
    assert not wrong, wrong
