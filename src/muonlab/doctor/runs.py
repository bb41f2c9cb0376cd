"""The short training runs of the GPU check: `muonlab train` in a child process per run, compiled on
CUDA, on a corpus that needs no network, its `--json` result read back.

A child process per run gives each run a wall-clock limit that can be enforced (its whole
process group is stopped when it is reached), a fresh CUDA context (one run's out-of-memory or
compile failure cannot leak into the next) and the exact command a user would type, recorded
with the result. The runs share one cache directory, so the corpus and tokenizers are prepared
once, and torch's compile cache, so a later run reuses what an earlier one compiled.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The corpus of every run: the embedded Python stdlib, which needs no network (the GPU presets'
# ClimbMix shards are downloaded). BPE reads whole documents (the default 10,000-character cap
# per document leaves too little text for the 50,304-token vocabulary of nanogpt-124m; the whole
# 11 MB corpus reaches it). The vocabulary, the model and the batch stay the preset's.
DATA_FLAGS = ("--source", "stdlib", "--tokenizer-doc-cap", "1000000000")
EVAL_TOKENS = 131_072  # per split: the runs check that evaluation runs, not what it scores
_GRACE_S = 15.0  # after SIGTERM at the limit, how long a run may take to record itself


@dataclass
class Finished:
    """How a child process ended."""

    returncode: int | None  # None: stopped at its limit
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_process(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | Path | None = None) -> Finished:
    """Run argv in its own process group; at `timeout_s` the group gets SIGTERM, then SIGKILL
    (a compile's worker processes included). Ctrl-C here stops the group too."""
    start = time.monotonic()
    signals = _SignalsStopChildren()
    signals.install()  # before the child exists: a SIGTERM while it starts is held, not lost with an orphan
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                                start_new_session=True)
    except BaseException:
        signals.restore()
        raise
    try:
        try:
            signals.arm()  # a signal held while the child started stops it now
            out, err = proc.communicate(timeout=max(timeout_s, 0.1))
        finally:
            signals.restore()
        return Finished(proc.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        out, err = _stop_group(proc)
        return Finished(None, out, err, time.monotonic() - start)
    except BaseException:
        _stop_group(proc)
        raise


class Stopped(SystemExit):
    """The check itself was sent SIGTERM or SIGHUP (`timeout`'s default signal): its child's group goes too."""


class _SignalsStopChildren:
    """SIGTERM and SIGHUP raise Stopped while a child runs, so `run_process` stops the child's process group
    (a new session: the signal to this process alone would leave it running) before this process exits. Installed
    before the child is started and armed once it exists: a signal in between is held and raised at `arm` (under
    load a child could start, and the signal come, before handlers installed after it: the child was orphaned)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.previous: dict = {}
        self.armed = False
        self.held: int | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._stop) for sig in self.SIGNALS}

    def _stop(self, signum, _frame) -> None:
        if not self.armed:
            self.held = signum
            return
        raise Stopped(128 + signum)

    def arm(self) -> None:
        self.armed = True
        if self.held is not None:
            raise Stopped(128 + self.held)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def _stop_group(proc: subprocess.Popen) -> tuple[str, str]:
    for sig, wait_s in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=wait_s)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            continue
    return "", ""


def child_env(cache_dir: Path) -> dict[str, str]:
    """The environment of a child process: it imports this muonlab (the folder above the package
    is put first on PYTHONPATH, so a source checkout's children do too) and keeps its data,
    tokenizers and runs under `cache_dir`."""
    import muonlab  # noqa: PLC0415

    root = str(Path(muonlab.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "MUONLAB_CACHE": str(cache_dir),
           "PYTHONUNBUFFERED": "1"}
    env.pop("MUONLAB_DEBUG", None)  # errors stay one line
    return env


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


def failure(done: Finished, timeout_s: float) -> str | None:
    """Why a child process did not succeed, in one line; None when it exited 0."""
    if done.timed_out:
        return f"stopped at its limit of {timeout_s:.0f} s ({last_line(done.stderr) or 'no output'})"
    if done.returncode != 0:
        return f"exit {done.returncode}: {last_line(done.stderr) or last_line(done.stdout) or 'no output'}"
    return None


def run_steps(run_dir: str | Path | None) -> list[dict[str, Any]]:
    """A run's per-step records (its metrics.jsonl); [] when there are none."""
    from muonlab.record.ledger import read_records  # noqa: PLC0415

    return list(read_records(Path(run_dir) / "metrics.jsonl")) if run_dir else []


def train_command(preset: str, num_steps: int, device: str = "cuda", compile_mode: str = "on",
                  data_flags: tuple[str, ...] = DATA_FLAGS, eval_tokens: int = EVAL_TOKENS,
                  run_name: str | None = None) -> list[str]:
    """The `muonlab train` command line of one check run."""
    named = ("--run-name", run_name) if run_name else ()
    return [sys.executable, "-m", "muonlab", "train", "--preset", preset, "--num-steps", str(num_steps),
            "--device", device, "--compile", compile_mode, *data_flags, "--eval-tokens", str(eval_tokens),
            *named, "--json"]


def progress(run_dir: Path, num_steps: int) -> str:
    """Where a stopped run had got to, from its metrics.jsonl: the phase a limit cut short."""
    steps = run_steps(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    if not steps:
        return "before its first step (start-up, data, model build or the first compile)"
    last = steps[-1]
    if last.get("step", 0) + 1 >= num_steps:
        return f"after its last step ({last.get('step')}), in the final evaluation"
    return f"at step {last.get('step')} of {num_steps}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def training_run(preset: str, num_steps: int, timeout_s: float, cache_dir: Path, **command: Any) -> dict[str, Any]:
    """One `muonlab train` run, summarised: status (ok only when the run finished ok with a
    finite training loss and validation BPB), seconds, its throughput figures, the error if any."""
    run_name = f"doctor-{preset}-{os.getpid()}-{time.time_ns()}"  # a known folder: its progress is read on failure
    argv = train_command(preset, num_steps, run_name=run_name, **command)
    done = run_process(argv, timeout_s, env=child_env(cache_dir))
    entry: dict[str, Any] = {"preset": preset, "num_steps": num_steps, "status": "failed", "error": None,
                             "seconds": round(done.seconds, 1), "timeout_s": round(timeout_s, 1),
                             "command": ["muonlab", *argv[3:]]}
    entry["error"] = failure(done, timeout_s)
    if entry["error"]:
        entry["stopped"] = progress(cache_dir / "runs" / run_name, num_steps)
        entry["error"] += f", {entry['stopped']}"
        entry["stderr_tail"] = done.stderr.strip().splitlines()[-8:]
        return entry
    try:
        payload = json.loads(done.stdout)
    except json.JSONDecodeError:
        entry["error"] = f"its --json output is not JSON: {last_line(done.stdout)!r}"
        return entry
    summary = payload.get("summary") or {}
    entry.update(read_summary(summary))
    entry["run_dir"] = payload.get("run_dir")
    entry["loss_finite"] = _finite(summary.get("final_train_loss")) and _finite(summary.get("val_bpb"))
    if payload.get("status") != "ok":
        entry["error"] = f"run status {payload.get('status')!r}"
    elif not entry["loss_finite"]:
        entry["error"] = "training loss or val_bpb is not finite"
    else:
        entry["status"] = "ok"
    return entry


def read_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures the check reports, from a run's summary.json: step time is one step's tokens
    over the timed steps' tokens per second (compile and warm-up steps are not timed)."""
    tokens_per_s = summary.get("tokens_per_second")
    steps = summary.get("num_steps")
    step_tokens = (summary.get("total_tokens_M") or 0) * 1e6 / steps if steps else None
    step_s = step_tokens / tokens_per_s if step_tokens and _finite(tokens_per_s) and tokens_per_s > 0 else None
    return {
        "steps_done": steps,
        "tokens_per_second": tokens_per_s if _finite(tokens_per_s) else None,
        "step_seconds": step_s,
        "mfu_percent": summary.get("mfu_percent"),
        "peak_vram_mb": summary.get("peak_vram_mb"),
        "training_seconds": summary.get("training_seconds"),
        "startup_seconds": summary.get("startup_seconds"),
        "final_train_loss": summary.get("final_train_loss"),
        "val_bpb": summary.get("val_bpb"),
        "attention_backend": summary.get("attention_backend"),
    }
