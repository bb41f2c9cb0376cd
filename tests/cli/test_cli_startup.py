"""`muonlab --help` and `--version` answer without importing torch or any model family (torch is imported
only when a command needs it); benchmarks/cli_startup.py measures how long they take."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import contextlib, io, json, sys
from muonlab.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main({argv!r})
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in ("torch", "numpy", "muonlab.config", "muonlab.families") if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy, "out": out.getvalue(), "err": err.getvalue()}}))
"""


def probe(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("argv,code,text", [(["--help"], 0, "sweep"), (["--version"], 0, "muonlab 0.1"),
                                            ([], 2, "VERB")])
def test_top_level_help_version_and_usage_import_no_torch(argv, code, text):
    result = probe(argv)
    assert result["code"] == code and result["heavy"] == [], result
    assert text in result["out"] + result["err"], result


def test_a_verbs_help_still_shows_its_config_flags_with_their_preset_defaults():
    result = probe(["train", "--preset", "cpu-tiny", "--help"])
    text = " ".join(result["out"].split())
    assert result["code"] == 0 and "torch" in result["heavy"], result["err"]
    assert "--matrix-lr" in text and "--device cpu" in text and "cpu-tiny" in text, text[:2000]
