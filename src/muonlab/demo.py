"""`muonlab demo`: the whole pipeline on a CPU in a few minutes.

Prepares the embedded `stdlib` corpus and a 2048-token BPE (cached after the first run),
trains the baseline with the `cpu-demo` preset, evaluates validation and holdout BPB, and
compares the holdout BPB with `xz -9e` (Python's lzma, preset 9 | PRESET_EXTREME) on exactly
the bytes the model was scored on. A model that cannot beat a general-purpose compressor on
its own holdout text has learned little; beating it shows the stack works end to end.
"""

from __future__ import annotations

import time
from typing import Callable

from muonlab.config import apply_overrides, preset
from muonlab.data.prepare import compress_bits_per_byte, prepare_data
from muonlab.train import run_training
from muonlab.train.run import format_summary


def run_demo(cache_dir: str | None = None, log: Callable[[str], None] = print, quiet: bool = False,
             overrides: dict | None = None) -> dict:
    t0 = time.time()
    cfg = apply_overrides(preset("cpu-demo"), {"arm": "baseline", "quiet": quiet, **(overrides or {})})
    cfg.data.cache_dir = cache_dir
    cfg.validate()
    data = prepare_data(cfg.data, log=log)
    prepare_seconds = time.time() - t0
    result = run_training(cfg, log=log, data=data)
    holdout = data.eval_bytes("holdout", cfg.train.sequence_len, cfg.train.eval_tokens)
    xz_bpb = compress_bits_per_byte(holdout)
    return {
        "val_bpb": result.summary["val_bpb"],
        "holdout_bpb": result.summary["holdout_bpb"],
        "xz_holdout_bpb": xz_bpb,
        "holdout_bytes": len(holdout),
        "beats_xz": result.summary["holdout_bpb"] < xz_bpb,
        "prepare_seconds": prepare_seconds,
        "total_seconds": time.time() - t0,
        "run_dir": str(result.run_dir),
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
    ])
