"""Export a ledger as upstream autoresearch's `results.tsv` (program.md, "Logging results").

Five tab-separated columns: commit (7 chars), val_bpb (6 decimals; 0.000000 for crashes),
memory_gb (peak memory / 1024, 1 decimal; 0.0 for crashes), status and description. Upstream's
status is the agent's keep/discard decision; here it is derived in ledger order: `keep` when a
run lowers the best val_bpb so far, `discard` otherwise, `crash` for failed or diverged runs.
"""

from __future__ import annotations

from typing import Iterable

HEADER = ("commit", "val_bpb", "memory_gb", "status", "description")


def _clean(text: str) -> str:
    return " ".join(str(text).split())  # tabs and newlines would break the columns


def results_tsv(records: Iterable[dict]) -> str:
    lines = ["\t".join(HEADER)]
    best = float("inf")
    for rec in records:
        commit = (rec.get("provenance", {}).get("git_commit") or "unknown")[:7]
        metrics = rec.get("metrics") or {}
        description = _clean(f"{rec.get('arm')} seed={rec.get('seed')} run={rec.get('run_id')}")
        if rec.get("status") == "ok" and isinstance(metrics.get("val_bpb"), (int, float)):
            val = float(metrics["val_bpb"])
            memory_gb = float(metrics.get("peak_memory_mb") or 0.0) / 1024
            status = "keep" if val < best else "discard"
            best = min(best, val)
        else:
            val, memory_gb, status = 0.0, 0.0, "crash"
            if rec.get("error"):
                description += _clean(f" ({rec['status']}: {rec['error']})")
        lines.append(f"{commit}\t{val:.6f}\t{memory_gb:.1f}\t{status}\t{description}")
    return "\n".join(lines) + "\n"
