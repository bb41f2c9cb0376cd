"""`muonlab demo`: the whole pipeline on a CPU in a few minutes.

Prepares the embedded `stdlib` corpus and a 2048-token BPE (cached after the first run),
trains the baseline with the `cpu-demo` preset, evaluates validation and holdout BPB, and
compares the holdout BPB with `xz -9e` (Python's lzma, preset 9 | PRESET_EXTREME) on exactly
the bytes the model was scored on. A model that cannot beat a general-purpose compressor on
its own holdout text has learned little; beating it shows the stack works end to end.

It trains in bf16 autocast where the CPU multiplies bf16 natively (AVX512-BF16 or AMX) and in
fp32 elsewhere (bf16 products are emulated there and slower than fp32). It ends with what the
tool is for: a picture of the validation BPB at the periodic evaluations falling past xz's bits per
byte on the same bytes (`bpb_vs_xz.png` in the run directory), the run's line in the ledger, and
the commands that turn one run into a multi-seed comparison.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from muonlab.config import apply_overrides, preset
from muonlab.data.prepare import compress_bits_per_byte, prepare_data
from muonlab.device import cpu_has_native_bf16
from muonlab.optional import require
from muonlab.record.ledger import read_records
from muonlab.record.rundir import ledger_path
from muonlab.train import run_training
from muonlab.train.run import format_summary

# periodic evaluations for the picture: every 65 of the 650 steps, on 32K validation tokens
DEMO_EVALS = {"train.eval_every": 65, "train.eval_every_tokens": 2**15}
NEXT_COMMANDS = (
    ("compare two arms over three seeds (resumable; the ledger keeps every run)",
     "muonlab sweep --preset cpu-demo --arms baseline,adamw_only --seeds 1,2,3"),
    ("paired contrasts, t-intervals, p-values and plots of what the ledger holds", "muonlab report"),
    ("every registered method and arm of the seed papers", "muonlab methods"),
    ("check the baseline against upstream's own recording", "muonlab verify-reference tests/golden/upstream_d2e32_fp32.pt"),
)


def demo_precision() -> str:
    """bf16 autocast where the CPU has bf16 matrix units, else fp32."""
    return "bf16" if cpu_has_native_bf16() else "fp32"


def write_bpb_curve(record: dict, val_bytes: bytes, path: Path) -> tuple[Path, float]:
    """The run's validation BPB at its periodic evaluations against xz -9e on exactly the bytes they
    scored, as bpb_vs_xz.png in its directory; returns the path and xz's bits per byte."""
    from muonlab.lab.plots import plot_bpb_against_compressor

    evals = record.get("evals") or []
    if not evals:
        raise RuntimeError(f"run {record.get('run_id')}: no periodic evaluation recorded")
    xz_bpb = compress_bits_per_byte(val_bytes)
    plot_bpb_against_compressor([e["step"] for e in evals], [e["val_bpb"] for e in evals], xz_bpb, path,
                                title=f"muonlab demo: validation BPB vs xz on the same {len(val_bytes):,} bytes")
    return path, xz_bpb


def ledger_line(ledger: Path, run_id: str) -> dict:
    """The ledger's record of `run_id` (the demo's own run)."""
    matches = [r for r in read_records(ledger) if r.get("run_id") == run_id]
    if not matches:
        raise RuntimeError(f"{ledger}: no line for run {run_id}")
    return matches[-1]


def run_demo(cache_dir: str | None = None, log: Callable[[str], None] = print, quiet: bool = False,
             overrides: dict | None = None) -> dict:
    t0 = time.time()
    cfg = apply_overrides(preset("cpu-demo"), {"arm": "baseline", "quiet": quiet, "precision": demo_precision(),
                                               **DEMO_EVALS, **(overrides or {})})
    cfg.data.cache_dir = cache_dir
    cfg.validate()
    require("matplotlib", "the demo's picture")  # before minutes of training, not after
    data = prepare_data(cfg.data, log=log)
    prepare_seconds = time.time() - t0
    result = run_training(cfg, log=log, data=data)
    holdout = data.eval_bytes("holdout", cfg.train.sequence_len, cfg.train.eval_tokens)
    xz_bpb = compress_bits_per_byte(holdout)
    run_dir, ledger = Path(result.run_dir), ledger_path(cfg)
    record = ledger_line(ledger, run_dir.name)
    val_bytes = data.eval_bytes("val", cfg.train.sequence_len, cfg.train.eval_every_tokens or cfg.train.eval_tokens)
    curve, xz_val_bpb = write_bpb_curve(record, val_bytes, run_dir / "bpb_vs_xz.png")
    return {
        "val_bpb": result.summary["val_bpb"],
        "holdout_bpb": result.summary["holdout_bpb"],
        "xz_holdout_bpb": xz_bpb,
        "holdout_bytes": len(holdout),
        "beats_xz": result.summary["holdout_bpb"] < xz_bpb,
        "prepare_seconds": prepare_seconds,
        "total_seconds": time.time() - t0,
        "run_dir": str(run_dir),
        "bpb_curve": str(curve),
        "xz_val_bpb": xz_val_bpb,
        "ledger": str(ledger),
        "ledger_line": {k: record.get(k) for k in ("run_id", "arm", "seed", "status", "protocol", "config_hash")}
        | {"val_bpb": record.get("metrics", {}).get("val_bpb")},
        "precision": cfg.runtime.precision,
        "summary": result.summary,
    }


def format_demo(report: dict) -> str:
    verdict = "beats" if report["beats_xz"] else "does NOT beat"
    return "\n".join([
        format_summary(report["summary"]),
        f"{'xz_holdout_bpb:':<18}{report['xz_holdout_bpb']:.6f}   (xz -9e on the same "
        f"{report['holdout_bytes']:,} holdout bytes)",
        f"demo: the model {verdict} xz on the holdout text "
        f"({report['holdout_bpb']:.4f} vs {report['xz_holdout_bpb']:.4f} bits per byte); "
        f"data preparation {report['prepare_seconds']:.0f}s, total {report['total_seconds']:.0f}s",
        f"run directory: {report['run_dir']}",
        f"BPB vs xz:     {report['bpb_curve']}",
        f"ledger line:   {json.dumps(report['ledger_line'])}",
        f"               (in {report['ledger']})",
        "next:",
        *(f"  {command:<{max(len(c) for _, c in NEXT_COMMANDS)}}  # {why}" for why, command in NEXT_COMMANDS),
    ])
