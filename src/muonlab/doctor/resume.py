"""The GPU check's distributed section: both distributed optimizers under a 1-GPU torchrun.

A torchrun world of one joins an NCCL group and takes the N-rank code path
(muonlab.train.distributed): the collectives of DistMuonAdamW (autoresearch, `cpu-tiny`'s
shape) and DistAFMuon (the tied family, `tied-cpu`'s shape), their sharded state gathered
into checkpoints. Each is trained for STEPS steps with a checkpoint every STEPS / 2; a copy of
its run directory, its newest checkpoint removed, is resumed from the middle one, and the
continuation is compared with the uninterrupted run. The runs are eager: on one H200 a cold compile
of even these small shapes did not finish within the 33 s a run had, and the compiled paths are the
pytest and throughput sections' (the collectives, the sharded state and the checkpoints are the
same code eager or compiled):
- the first resumed step's loss must equal the uninterrupted run's bit for bit: it is the
  forward pass of the restored weights on the restored batch, which no kernel choice changes;
- every later loss within CONTINUATION_ATOL: CUDA backward kernels that add with atomics
  (the compiled embedding backward) are not bitwise reproducible from run to run;
- the final weights are compared too, and whether they are bitwise equal is reported.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from muonlab.doctor.runs import child_env, failure, run_process, run_steps
from muonlab.record.ledger import read_records

STEPS = 8
CASES = (("DistMuonAdamW", "cpu-tiny"), ("DistAFMuon", "tied-cpu"))
# what a case after the first is left: its two eager torchrun runs on a warm GPU (H100, 2026-12-06: DistAFMuon's
# 18.9 s and its resume 18.6 s)
CASE_RESERVE_S = 40.0
CONTINUATION_ATOL = 1e-3  # nats: bf16 runs whose backward adds with atomics, 4 steps apart


def torchrun_command(*train_args: str) -> list[str]:
    """`torchrun --standalone --nproc_per_node 1 -m muonlab train ...` with this Python."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "-m", "muonlab", "train", *train_args]


def _ledger_record(runs_dir: Path, run_id: str) -> dict[str, Any] | None:
    """The run's latest ledger line."""
    return next((r for r in reversed(list(read_records(runs_dir / "ledger.jsonl"))) if r.get("run_id") == run_id),
                None)


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in run_steps(run_dir)}


def _weights_diff(a: Path, b: Path) -> tuple[bool, float]:
    import torch  # noqa: PLC0415

    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    if wa.keys() != wb.keys():
        return False, float("inf")
    diff = max(((wa[k].float() - wb[k].float()).abs().max().item() for k in wa), default=0.0)
    return all(torch.equal(wa[k], wb[k]) for k in wa), diff


def _run(argv: list[str], limit_s: float, cache_dir: Path) -> tuple[bool, str]:
    error = failure(run_process(argv, limit_s, env=child_env(cache_dir)), limit_s)
    return error is None, error or ""


def resume_case(optimizer: str, preset: str, deadline: float, cache_dir: Path, device: str = "cuda",
                compile_mode: str = "off", backend: str = "nccl") -> dict[str, Any]:
    """One optimizer's uninterrupted run, its resume from the middle checkpoint, the comparison
    (device, compile_mode and the expected backend: the CPU test runs the same on gloo)."""
    runs_dir = cache_dir / "runs"
    name = f"dist-{preset}"
    # --collectives always: the world of one runs the N-rank optimizer step, its collectives on this backend
    full_argv = torchrun_command("--preset", preset, "--device", device, "--compile", compile_mode, "--collectives",
                                 "always", "--num-steps", str(STEPS),
                                 "--checkpoint-every", str(STEPS // 2), "--checkpoint-keep", "2",
                                 "--run-name", name, "--json")
    entry: dict[str, Any] = {"optimizer": optimizer, "preset": preset, "status": "failed", "error": None,
                             "command": ["torchrun", *full_argv[3:]]}
    start = time.monotonic()
    ok, error = _run(full_argv, (deadline - time.monotonic()) * 0.6, cache_dir)  # the resume has the data ready
    entry["full_seconds"] = round(time.monotonic() - start, 1)
    if not ok:
        entry["error"] = f"the uninterrupted run: {error}"
        return entry
    full_dir = runs_dir / name
    record = _ledger_record(runs_dir, name) or {}
    entry.update(process_group=record.get("process_group"), world_size=record.get("world_size"))
    if record.get("process_group") != backend:
        entry["error"] = f"the run did not join a {backend} group (process_group {record.get('process_group')!r})"
        return entry
    resumed_dir = runs_dir / f"{name}-resumed"
    shutil.rmtree(resumed_dir, ignore_errors=True)
    shutil.copytree(full_dir, resumed_dir)
    newest = sorted((resumed_dir / "checkpoints").glob("step-*.pt"))[-1]
    newest.unlink()
    newest.with_suffix(".json").unlink(missing_ok=True)
    (resumed_dir / "model.pt").unlink(missing_ok=True)
    start = time.monotonic()
    ok, error = _run(torchrun_command("--resume", str(resumed_dir), "--json"), deadline - time.monotonic(), cache_dir)
    entry["resume_seconds"] = round(time.monotonic() - start, 1)
    if not ok:
        entry["error"] = f"the resume: {error}"
        return entry
    figures, problems = judge_continuation(_losses(full_dir), _losses(resumed_dir), STEPS // 2, STEPS)
    entry.update(figures)
    if not problems:
        entry["final_weights_bitwise"], entry["max_weight_diff"] = _weights_diff(full_dir / "model.pt",
                                                                                 resumed_dir / "model.pt")
    entry.update(status="failed" if problems else "ok", error="; ".join(problems) or None)
    return entry


def judge_continuation(full: dict[int, float], resumed: dict[int, float], middle: int,
                       steps: int) -> tuple[dict[str, Any], list[str]]:
    """(figures, problems) of a run resumed at step `middle` against the uninterrupted one
    (step -> loss of each): the first resumed step bit for bit, the rest within CONTINUATION_ATOL."""
    continued = list(range(middle, steps))
    if any(s not in resumed or s not in full for s in continued):
        return {}, [f"the resumed run logged steps {sorted(resumed)}, not {middle}..{steps - 1}"]
    gaps = [abs(resumed[s] - full[s]) for s in continued]
    figures = {"first_resumed_step": middle, "first_step_bitwise": resumed[middle] == full[middle],
               "all_steps_bitwise": all(g == 0 for g in gaps), "max_loss_gap": max(gaps)}
    problems = []
    if not figures["first_step_bitwise"]:
        problems.append(f"step {middle}: resumed loss {resumed[middle]!r}, uninterrupted {full[middle]!r}")
    if max(gaps) > CONTINUATION_ATOL:
        problems.append(f"the continuation drifts by {max(gaps):.3g} nats (allowed {CONTINUATION_ATOL})")
    return figures, problems


def distributed_check(limit_s: float, cache_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both optimizers' cases within `limit_s`; one the time did not reach is not run."""
    deadline = time.monotonic() + limit_s
    runs: dict[str, dict[str, Any]] = {}
    for i, (optimizer, preset) in enumerate(CASES):
        # what is left, less what the cases after this one need: the first run on a cold GPU pays more than an
        # even share (H100, 2026-12-06: 26.9 s, over its even share's 25 s, where a warm one took 18.9 s)
        share = deadline - time.monotonic() - CASE_RESERVE_S * (len(CASES) - 1 - i)
        if share < 10:
            runs[optimizer] = {"optimizer": optimizer, "preset": preset, "status": "not_run",
                               "error": None, "reason": "the section's time was spent before it"}
            continue
        log(f"  distributed: {optimizer} on {preset}, torchrun world of 1 (limit {share:.0f} s)")
        runs[optimizer] = resume_case(optimizer, preset, time.monotonic() + share, cache_dir)
    failed = [f"{n} ({r['error']})" for n, r in runs.items() if r["status"] == "failed"]
    not_run = [n for n, r in runs.items() if r["status"] == "not_run"]
    status = "failed" if failed else "not_run" if not_run else "ok"  # one case not reached: not a pass
    return {"status": status, "error": "; ".join(failed) or None, "steps": STEPS, "runs": runs,
            **({"reason": f"the section's time was spent before {', '.join(not_run)}"} if status == "not_run" else {})}
