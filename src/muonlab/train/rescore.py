"""`muonlab eval RUN`: score a saved run again, in a process of its own, and compare with its record.

Seed 000 re-measured its checkpoints independently of the training process (its measure_loss.py,
difference 0.0) and seed 002 scored old checkpoints on the held-out split. This builds the run's
model from its config.json (its plug-ins imported), loads its final weights (`model.safetensors`, else `model.pt`) or the
checkpoint after `step` steps (`checkpoints/step-NNNNNN.pt`), and scores the splits with the run's
own data, tokenizer, precision and compile setting (muonlab.train.load reads the weights), as
the run scored them:

- the final weights: every split over `train.eval_tokens` tokens, compared with summary.json
  (and the ledger line's metrics where the summary leaves a figure out);
- a checkpoint: the val split as the run's periodic evaluation scored it (`train.eval_every_tokens`,
  compared with the metrics.jsonl line of that step where the run evaluated there), the holdout
  split over `train.eval_tokens`.

On the machine and precision that trained the run the scores are equal to the record bit for bit;
elsewhere they differ by the rounding of another machine's kernels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from muonlab.config import is_legacy, load_config_file, read_config_values
from muonlab.device import Runtime, resolve_precision
from muonlab.errors import UsageError
from muonlab.families import get_family
from muonlab.record.ledger import read_records_tolerant
from muonlab.record.rundir import POSTHOC_FILE, ledger_path, periodic_evals, read_posthoc
from muonlab.train.build import build_model
from muonlab.train.distributed import Dist
from muonlab.train.load import run_weights
from muonlab.train.run import COUNT_KEYS, use_compile, evaluate_splits, training_device

SPLITS = ("val", "holdout")


@dataclass
class Rescore:
    run_dir: str
    weights: str  # the file scored
    step: int | None  # None: the final weights
    scores: dict[str, float] = field(default_factory=dict)  # val_bpb, holdout_ce, ...
    recorded: dict[str, float] = field(default_factory=dict)  # the same keys as the run recorded them

    @property
    def equal(self) -> bool | None:
        """Every recorded figure equal bit for bit (None: nothing recorded to compare with)."""
        shared = [k for k in self.scores if k in self.recorded]
        return None if not shared else all(_same(self.scores[k], self.recorded[k]) for k in shared)

    def to_dict(self) -> dict[str, Any]:
        return dict(run_dir=self.run_dir, weights=self.weights, step=self.step, scores=self.scores,
                    recorded=self.recorded, equal=self.equal)

    def format(self) -> str:
        lines = [f"{'metric':<14} {'scored':>14} {'recorded':>14}  difference"]
        for key, value in self.scores.items():
            rec = self.recorded.get(key)
            diff = "-" if rec is None else ("equal" if _same(value, rec) else f"{value - rec:+.3e}")
            lines.append(f"{key:<14} {value:>14.9f} {'-' if rec is None else f'{rec:.9f}':>14}  {diff}")
        verdict = {True: "equal to the record, bit for bit", False: "NOT equal to the record",
                   None: "nothing recorded at this point to compare with"}[self.equal]
        where = "final weights" if self.step is None else f"the checkpoint after step {self.step}"
        return "\n".join([f"{self.run_dir}: {where} ({self.weights})", *lines, verdict])


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def rescore_run(run_dir: str | Path, step: int | None = None, splits: tuple[str, ...] = SPLITS,
                device: str | None = None, log: Callable[[str], None] = print) -> Rescore:
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise UsageError(f"--splits takes {' and/or '.join(SPLITS)}, got {','.join(splits) or 'none'}")
    saved = read_config_values(run_dir / "config.json")
    if is_legacy(saved):
        raise UsageError(f"{run_dir} was written by an older muonlab (config format 1): it cannot be re-scored")
    cfg = load_config_file(run_dir / "config.json", values=saved)
    cfg.check_plugin_code("re-scoring it")
    if device is not None:
        cfg.runtime.device = device
    weights_path, weights, _ = run_weights(run_dir, step)
    family = get_family(cfg.family)
    where = training_device(cfg)
    runtime = Runtime(where, resolve_precision(cfg.runtime.precision, where))
    torch.manual_seed(cfg.seed)
    data = family.prepare_data(cfg, log=log)
    model = build_model(cfg, data.vocab_size, runtime)
    model.load_state_dict(weights)
    scored = torch.compile(model, dynamic=False) if use_compile(cfg, runtime) else model  # as the run scored
    evaluate = family.evaluate or evaluate_splits
    result = Rescore(str(run_dir), str(weights_path), step)
    for split in splits:
        # a checkpoint's val split as the periodic evaluation scores it; everything else as at the end
        tokens = cfg.train.eval_every_tokens if step is not None and split == "val" else None
        out = evaluate(scored, data, cfg, runtime, Dist(), splits=(split,), tokens=tokens)[split]
        result.scores.update({f"{split}_{k}": v for k, v in out.metrics().items() if k not in COUNT_KEYS})
    result.recorded = _recorded(run_dir, cfg, step, set(result.scores))
    return result


def _recorded(run_dir: Path, cfg, step: int | None, keys: set[str]) -> dict[str, float]:
    """The run's own figures for `keys`: summary.json and its ledger line (final), or the periodic
    evaluation after `step` steps in its metrics.jsonl."""
    out: dict[str, float] = {}
    if step is None:
        summary = run_dir / "summary.json"
        if summary.is_file():
            out.update({k: v for k, v in json.loads(summary.read_text()).items() if k in keys})
        records, _ = read_records_tolerant(ledger_path(cfg)) if ledger_path(cfg).is_file() else ([], [])
        line = next((r for r in reversed(records) if r.get("run_id") == run_dir.name and r.get("status") == "ok"), None)
        if line is not None:
            out.update({k: v for k, v in line.get("metrics", {}).items() if k in keys and k not in out})
        return out
    for evaluation in periodic_evals(run_dir / "metrics.jsonl", cfg.train.total_batch_size):
        if evaluation["step"] == step:
            out.update({k: v for k, v in evaluation.items() if k in keys})
    return out


def rescore_every(run_dir: str | Path, every: int, device: str | None = None,
                  log: Callable[[str], None] = print) -> list[Rescore]:
    """Score the val split of each checkpoint a run kept after a multiple of `every` steps (before its end: its
    final evaluation is the end's), as its periodic evaluation would have, and record them in the run's
    evals.jsonl, where `report --at-step` reads them beside the evaluations the run made itself. Steps are
    steps done (the checkpoint after N steps is step N), as everywhere a user gives or reads one."""
    from muonlab.record.ledger import append_line  # noqa: PLC0415
    from muonlab.train.checkpoint import list_checkpoints  # noqa: PLC0415

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json)")
    cfg = load_config_file(run_dir / "config.json")
    kept = sorted(int(p.stem.split("-")[1]) for p in list_checkpoints(run_dir))
    final = _final_steps(run_dir)
    due = [s for s in kept if s % every == 0 and (final is None or s < final)]
    if not due:
        have = ", ".join(map(str, kept)) or "none"
        raise UsageError(f"{run_dir.name} kept no checkpoint after a multiple of {every} steps before its end "
                         f"(checkpoints after steps: {have}; it keeps the {cfg.record.checkpoint_keep} newest): to "
                         f"have these evaluations, train it again with --eval-every {every}, or with "
                         f"--checkpoint-every {every} and a --checkpoint-keep that keeps them, then eval --every")
    done = {e["step"] for e in read_posthoc(run_dir)}
    out = []
    for step in due:
        result = rescore_run(run_dir, step=step, splits=("val",), device=device, log=log)
        out.append(result)
        if step not in done:
            line = {"step": step, "tokens": step * cfg.train.total_batch_size, **result.scores,
                    "weights": Path(result.weights).name}
            append_line(run_dir / POSTHOC_FILE, line, what="the run's evaluations")
    return out


def _final_steps(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "summary.json").read_text())["num_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
