"""`muonlab doctor --gpu`: every CUDA path of muonlab checked on one GPU, within a time budget
(8 minutes by default, sized for one H100/H200 from a cold start), into one JSON file.

Sections, in order, each recorded as ok / failed (with its error) / skipped (with its reason) /
not_run (the budget did not reach it), with its duration and limit; a section that fails does
not stop the others:
1. environment: CUDA device, capability, torch / CUDA / driver versions, FlashAttention-3 (the
   backend `auto` resolves to; the reason when it cannot load), Triton, and a tiny function
   run through torch.compile in a child process.
2. pytest: `pytest -m gpu` over the test files that hold gpu tests, those asking for the `cuda`
   fixture (tests/doctor/test_gpu_acceptance.py: the attention backends against an fp32 reference,
   compiled against eager for one arm of every method and model family, the LMO on CUDA against CPU;
   and the others), its counts read from a JUnit XML report.
3. throughput: a compiled 50-step gpu-d8 run: its loss falls, no graph is compiled after the
   warm-up steps, and its tokens/s, MFU, peak memory and step breakdown beside upstream's published
   figures; then one attention layer of gpu-d8 timed on flex, SDPA and FA3 where it loads
   (muonlab.model.attention_timing, a child process with its own limit).
4. distributed: a 1-GPU torchrun (NCCL, a world of one through the N-rank code path) of both
   distributed optimizers (muonlab.doctor.resume): a checkpoint, a resume from it, and the
   continuation against the uninterrupted run.

The sections' limits sum within the budget (`--plan` prints them, no GPU needed); each limit is
also cut to what is left. The exit status is 0 when no section failed, 1 otherwise. Without
CUDA nothing is run and nothing is written (run_gpu_check returns None).
"""

from __future__ import annotations

import importlib.metadata
import json
import importlib.util
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from muonlab.doctor.runs import child_env, last_line, run_process, run_steps, training_run
from muonlab.errors import UsageError

FORMAT = "muonlab-gpu-check/1"
SECTIONS = ("environment", "pytest", "throughput", "distributed")
DEFAULT_OUT = "gpu_check.json"
# 8 minutes: benchmarks/gpu_acceptance.sh's 8.5 minutes less its own start (Python, the carried wheels)
DEFAULT_BUDGET_S = 480.0
# Each section's own limit (seconds); with SLACK_S they sum to DEFAULT_BUDGET_S. Measured from cold starts
# (torch 2.11, 16 cores, FlexAttention, no FA3). One H200: environment 29.6 s (a cold torch.compile of one
# elementwise function is 29.5 s of it); pytest 140 s on 4 workers (now 8); the 50-step gpu-d8 run 177.8 s
# (start-up 8 s, 50 steps of 0.98 s, the rest compiling the training step, the optimizer step and the
# evaluation); DistAFMuon's eager torchrun runs 17.7 + 18.2 s (compiled, they did not finish in 33 s each).
# One H100, 2026-12-06: environment 24.2 s; pytest 113.5 s on 8 workers; the gpu-d8 run 163 s, its step
# waiting 60% of its 0.63 s for data (encoded on threads then; in processes now, so its 50 steps take less);
# the attention timing (a cold Python, one flex and one SDPA layer compiled, 10 rounds) stopped at its 20 s;
# DistMuonAdamW's first run (it also trains cpu-tiny's tokenizer) 26.9 s, over its even share's 25 s, and
# DistAFMuon's 18.9 + 18.6 s. So pytest gives 5 s and the training run 15 s to the attention timing (35 s)
# and the distributed section (95 s); the slack is one stopped child's grace.
TRAINING_LIMIT_S, ATTENTION_LIMIT_S = 175.0, 35.0
LIMITS_S = {"environment": 35.0, "pytest": 125.0, "throughput": TRAINING_LIMIT_S + ATTENTION_LIMIT_S,
            "distributed": 95.0}
# What the limits leave of the budget: a child stopped at its limit gets its grace (runs._GRACE_S) and the
# environment section's work is not bounded, so they come out of this, not out of the next section. A section
# starts only with its whole limit left; one that would be cut short is not run (never failed for want of time).
SLACK_S = DEFAULT_BUDGET_S - sum(LIMITS_S.values())
MIN_START_S = 20.0  # a section or run given less than this is not started
NO_CUDA_LINE = "no CUDA device found: the GPU check ran nothing and wrote no file"

THROUGHPUT_PRESET, THROUGHPUT_STEPS = "gpu-d8", 50
WARMUP_STEPS = 3  # steps that may compile (the first step, its backward, the optimizer's graphs)
MIN_LOSS_DROP = 1.0  # nats the 50-step run's loss must fall by (from ~ln 8192 = 9.0 at step 0)
# Upstream's published baseline: karpathy/autoresearch program.md (commit 228791f), "Output
# format", the summary of the depth-8 baseline run (`mfu_percent: 39.80`, 953 steps in 300.1 s,
# peak_vram_mb 45060.2); its README: "tested on H100". MFU over 989.5 TFLOP/s dense bf16.
UPSTREAM_MFU_PERCENT = 39.8
UPSTREAM_PEAK_VRAM_MB = 45060.2
# muonlab's targets for gpu-d8 (reported, not enforced): with FA3, and on the fallback kernel
TARGET_MFU_PERCENT = {"fa3": 45.0, "flex": 40.0}


# ------------------------------------------------------------------------------ options
def default_tests_dir() -> Path | None:
    """The checkout's tests/ beside src/ (an installed package has none)."""
    import muonlab  # noqa: PLC0415

    candidate = Path(muonlab.__file__).resolve().parents[2] / "tests"
    return candidate if (candidate / "conftest.py").is_file() else None


@dataclass
class GpuCheckOptions:
    out: Path = Path(DEFAULT_OUT)
    tests: Path | None = None  # None: default_tests_dir()
    budget_s: float = DEFAULT_BUDGET_S
    skip: tuple[str, ...] = ()
    pytest_workers: int | None = None  # None: 4 with pytest-xdist (1 without, or on an exclusive GPU)
    require_fa3: bool = False
    work_dir: Path | None = None  # None: a temporary folder, removed afterwards

    def validate(self) -> "GpuCheckOptions":
        """Raise UsageError for input that is wrong whatever the machine (checked before CUDA is)."""
        self.out = Path(self.out)
        if self.out.is_dir():
            raise UsageError(f"--out {self.out} is a directory; give a file path")
        if self.tests is not None:
            self.tests = Path(self.tests)
            if not self.tests.is_dir():
                raise UsageError(f"--tests {self.tests}: no such folder")
        if not (isinstance(self.budget_s, (int, float)) and math.isfinite(self.budget_s) and self.budget_s > 0):
            raise UsageError(f"--budget-s must be > 0 seconds, got {self.budget_s}")
        unknown = sorted(set(self.skip) - set(SECTIONS))
        if unknown:
            raise UsageError(f"--skip: unknown section {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
        if self.pytest_workers is not None and self.pytest_workers < 0:
            raise UsageError(f"--pytest-workers must be >= 0, got {self.pytest_workers}")
        if self.work_dir is not None:
            self.work_dir = Path(self.work_dir)
            if self.work_dir.exists() and not self.work_dir.is_dir():
                raise UsageError(f"--work-dir {self.work_dir} is not a folder")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "tests": None if self.tests is None else str(self.tests),
                "budget_s": self.budget_s, "skip": list(self.skip), "pytest_workers": self.pytest_workers,
                "require_fa3": self.require_fa3, "work_dir": None if self.work_dir is None else str(self.work_dir)}


@dataclass
class Check:
    """One check in progress: its options, its deadline, its scratch folder, the sections so far."""

    options: GpuCheckOptions
    work_dir: Path
    log: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        return self.work_dir / "cache"

    def remaining(self) -> float:
        return self.options.budget_s - (time.monotonic() - self.started)

    def limit(self, own_s: float) -> float:
        return max(0.0, min(own_s, self.remaining()))


# ------------------------------------------------------------------------------ sections
def cuda_available() -> bool:
    import torch  # noqa: PLC0415

    return torch.cuda.is_available()


_COMPILE_PROBE = """
import json, torch
f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + x.sin(), dynamic=False)
x = torch.randn(4096, device="cuda")
y = f(x)
torch.cuda.synchronize()
err = (y - (torch.nn.functional.gelu(x) * 2.0 + x.sin())).abs().max().item()
print(json.dumps({"max_abs_error": err}))
raise SystemExit(0 if err < 1e-4 else 3)
"""


def _compile_probe(check: Check) -> dict[str, Any]:
    limit = check.limit(LIMITS_S["environment"])
    done = run_process([sys.executable, "-c", _COMPILE_PROBE], limit, env=child_env(check.cache_dir))
    result: dict[str, Any] = {"ok": done.returncode == 0, "seconds": round(done.seconds, 1), "error": None}
    if done.timed_out:
        result["error"] = f"a compiled elementwise function did not finish within {limit:.0f} s"
    elif done.returncode == 3:
        result["error"] = f"a compiled function gave wrong numbers ({last_line(done.stdout)})"
    elif done.returncode != 0:
        result["error"] = last_line(done.stderr) or f"exit {done.returncode}"
    return result


def _fa3_probe(device) -> dict[str, Any]:
    from muonlab.errors import MuonlabError  # noqa: PLC0415
    from muonlab.model.attention import fa3_source, resolve_backend  # noqa: PLC0415

    import torch  # noqa: PLC0415

    source = fa3_source(tuple(torch.cuda.get_device_capability(device)))
    result = {"available": False, "auto_backend": resolve_backend("auto", device).name, "error": None,
              "source": source}
    if result["auto_backend"] == "fa3":
        result["available"] = True
    else:  # ask for it explicitly: the error says why it does not load
        try:
            resolve_backend("fa3", device)
            result["available"] = True
        except MuonlabError as exc:
            result["error"] = str(exc)
    return result


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _nvidia_smi() -> dict[str, Any]:
    """Driver version and compute mode of the visible GPUs (None where nvidia-smi is missing)."""
    if shutil.which("nvidia-smi") is None:
        return {"driver_version": None, "compute_mode": None}
    done = run_process(["nvidia-smi", "--query-gpu=driver_version,compute_mode", "--format=csv,noheader"], 20.0)
    rows = [[p.strip() for p in line.split(",")] for line in done.stdout.splitlines() if "," in line]
    if done.returncode != 0 or not rows:
        return {"driver_version": None, "compute_mode": None}
    return {"driver_version": rows[0][0], "compute_mode": rows[0][1]}


def section_environment(check: Check) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from muonlab.version import __version__  # noqa: PLC0415
    from muonlab.device import peak_flops  # noqa: PLC0415

    device = torch.device("cuda")
    peak = peak_flops(device)
    env: dict[str, Any] = {
        "cuda_available": True, "device_name": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)), "device_count": torch.cuda.device_count(),
        "total_memory_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1),
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(), "python_version": platform.python_version(),
        "muonlab_version": __version__, **_nvidia_smi(),
    }
    env["fa3"] = _fa3_probe(device)
    env["triton"] = {"present": importlib.util.find_spec("triton") is not None,
                     "version": _package_version("triton", "pytorch-triton")}
    env["compile"] = _compile_probe(check)
    problems = []
    if not env["compile"]["ok"]:
        problems.append(f"torch.compile: {env['compile']['error']}")
    if not env["triton"]["present"]:
        problems.append("Triton is not installed (torch.compile's CUDA code generator)")
    if check.options.require_fa3 and not env["fa3"]["available"]:
        problems.append(f"FlashAttention-3 is required (--require-fa3): {env['fa3']['error']}")
    env["warnings"] = [] if env["fa3"]["available"] else [
        f"FlashAttention-3 does not load, runs use {env['fa3']['auto_backend']}: {env['fa3']['error']}"]
    env["status"] = "failed" if problems else "ok"
    env["error"] = "; ".join(problems) or None
    return env


def parse_junit(path: Path) -> dict[str, Any]:
    """Counts, failed tests and skip reasons of a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed, skipped = [], Counter()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag in ("failure", "error"):
            element = case.find(tag)
            if element is not None:
                failed.append(f"{name}: {' '.join((element.get('message') or tag).split())[:300]}")
        element = case.find("skipped")
        if element is not None:
            skipped[" ".join((element.get("message") or "").split())[:300]] += 1
    return {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"],
            "failed_tests": failed, "skip_reasons": dict(skipped)}


def pytest_workers(check: Check) -> int:
    requested = check.options.pytest_workers
    if requested is not None:
        return requested
    if importlib.util.find_spec("xdist") is None:
        return 1
    mode = (check.sections.get("environment") or {}).get("compute_mode") or "Default"
    if mode != "Default":
        return 1  # an exclusive-process GPU takes one process
    # the compiled tests are bound by inductor's and Triton's CPU work: a worker per two cores, up to 8
    return max(1, min(8, (os.cpu_count() or 2) // 2))


PER_TEST_TIMEOUT_S = 150  # pytest-timeout: a hung test fails alone and the report is still written


CUDA_FIXTURE = "cuda"  # the suite's fixture for the CUDA device: a test that asks for it is a gpu test (its tier)


def _asks_for_cuda(source: str) -> bool:
    """The code (not a string or comment) asks for the `cuda` fixture: a test's or a fixture's parameter, or
    `pytest.mark.usefixtures("cuda")`."""
    import ast  # noqa: PLC0415

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(arg.arg == CUDA_FIXTURE for arg in node.args.args + node.args.kwonlyargs):
                return True
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "usefixtures"
              and any(isinstance(a, ast.Constant) and a.value == CUDA_FIXTURE for a in node.args)):
            return True
    return False


def gpu_test_files(tests: Path) -> list[str]:
    """The test files that hold gpu tests (tests that ask for the `cuda` fixture). Only they are collected: the
    rest of the suite may import what a GPU image lacks (the layer tests' grimp, say), and collecting it would fail
    the section for tests it does not run."""
    return [str(path.resolve()) for path in sorted(tests.rglob("test_*.py"))
            if _asks_for_cuda(path.read_text(encoding="utf-8"))]


def pytest_command(tests: Path, junit: Path, workers: int, paths: list[str] | None = None) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        argv.append(f"--timeout={PER_TEST_TIMEOUT_S}")
    if workers > 1:
        argv += ["-n", str(workers)]
    return argv + (paths or gpu_test_files(tests))


def section_pytest(check: Check, paths: list[str] | None = None) -> dict[str, Any]:
    tests = check.options.tests or default_tests_dir()
    if tests is None:
        return {"status": "skipped", "reason": "no tests folder (an installed package ships none): pass --tests PATH"}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "reason": "pytest is not installed (pip install 'muonlab[test]')"}
    junit = check.work_dir / "pytest-gpu.xml"
    workers = pytest_workers(check)
    argv = pytest_command(tests, junit, workers, paths)
    limit = check.limit(LIMITS_S["pytest"])
    done = run_process(argv, limit, env=child_env(check.cache_dir), cwd=tests.resolve().parent)
    result: dict[str, Any] = {"tests": str(tests), "workers": workers, "timeout_s": round(limit, 1),
                              "command": ["pytest", *argv[3:]], "returncode": done.returncode}
    counts = parse_junit(junit) if junit.is_file() else None
    if counts:
        result.update(counts)
    if done.timed_out:
        error = f"stopped at its limit of {limit:.0f} s"
    elif counts is None:
        error = f"exit {done.returncode}, no report: {last_line(done.stderr) or last_line(done.stdout)}"
    elif done.returncode == 5 or counts["passed"] + counts["failed"] + counts["errors"] + counts["skipped"] == 0:
        error = "no gpu-marked test was collected"
    elif counts["failed"] or counts["errors"]:
        error = f"{counts['failed']} failed, {counts['errors']} errors: " + "; ".join(counts["failed_tests"][:3])
    elif done.returncode != 0:
        error = f"exit {done.returncode}: {last_line(done.stdout)}"
    elif counts["passed"] == 0:
        error = "every gpu test was skipped"
    else:
        error = None
    result.update(status="failed" if error else "ok", error=error)
    return result


def judge_curve(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's steps say beyond "it ran": the loss fell by MIN_LOSS_DROP from the first
    step, and dynamo compiled no graph after WARMUP_STEPS (metrics.jsonl's compiled_graphs)."""
    losses = [r["loss"] for r in steps]
    graphs = [r.get("compiled_graphs") for r in steps]
    out: dict[str, Any] = {"first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                           "loss_drop": losses[0] - losses[-1] if losses else None,
                           "graphs_after_warmup": None, "problems": []}
    if len(losses) < 2:
        out["problems"].append("the run logged fewer than 2 steps")
        return out
    if not out["loss_drop"] >= MIN_LOSS_DROP:
        out["problems"].append(f"the loss fell by {out['loss_drop']:.3f} nats in {len(losses)} steps "
                               f"({losses[0]:.3f} -> {losses[-1]:.3f}), less than {MIN_LOSS_DROP}")
    late = [g for g in graphs[WARMUP_STEPS - 1:] if g is not None]
    if not late:
        out["problems"].append("the run did not record its compiled graphs (was it compiled?)")
    else:
        out["graphs_after_warmup"] = late[-1] - late[0]
        if late[-1] != late[0]:
            out["problems"].append(f"{late[-1] - late[0]} graph(s) compiled after step {WARMUP_STEPS - 1}: a recompile")
    return out


BREAKDOWN_KEYS = ("dt", "data_wait", "t_forward_backward", "t_optimizer", "t_rest")


def step_breakdown(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Median seconds of each phase of a step over the steps after WARMUP_STEPS (muonlab.train.step_timer: on
    CUDA the device's time between events), and each phase's share of the step: where the time goes."""
    timed = [r for r in steps[WARMUP_STEPS:] if all(isinstance(r.get(k), (int, float)) for k in BREAKDOWN_KEYS)]
    if not timed:
        return None
    median = {k: statistics.median(r[k] for r in timed) for k in BREAKDOWN_KEYS}
    return {"steps": len(timed), "median_s": median,
            "share": {k: median[k] / median["dt"] for k in BREAKDOWN_KEYS[1:]} if median["dt"] > 0 else None}


def attention_timing(timeout_s: float, cache_dir: Path) -> dict[str, Any]:
    """gpu-d8's attention layer timed per backend in a child process (muonlab.model.attention_timing);
    status ok with its medians, `stopped` at its limit (the section's sizing, reported, not a failure of
    the product) or failed with the child's last line."""
    argv = [sys.executable, "-m", "muonlab.model.attention_timing", "--json"]
    done = run_process(argv, timeout_s, env=child_env(cache_dir))
    entry: dict[str, Any] = {"seconds": round(done.seconds, 1), "timeout_s": round(timeout_s, 1),
                             "command": ["python", *argv[1:]]}
    if done.timed_out:
        return {**entry, "status": "stopped", "error": f"stopped at its limit of {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {**entry, "status": "failed", "error": f"exit {done.returncode}: {last_line(done.stderr) or 'no output'}"}
    try:
        payload = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {**entry, "status": "failed", "error": f"its --json output is not JSON: {last_line(done.stdout)!r}"}
    if payload.get("status") == "skipped":  # the child found no CUDA device
        return {**entry, "status": "skipped", "error": None, "reason": "no CUDA device in the child"}
    return {**entry, **payload, "status": "ok", "error": None}


def section_throughput(check: Check) -> dict[str, Any]:
    entry = training_run(THROUGHPUT_PRESET, THROUGHPUT_STEPS, check.limit(TRAINING_LIMIT_S), check.cache_dir)
    mfu, backend = entry.get("mfu_percent"), entry.get("attention_backend")
    target = TARGET_MFU_PERCENT.get(backend)
    entry.update(upstream_mfu_percent=UPSTREAM_MFU_PERCENT, upstream_peak_vram_mb=UPSTREAM_PEAK_VRAM_MB,
                 target_mfu_percent=target,
                 meets_target=(mfu >= target) if isinstance(mfu, (int, float)) and target else None)
    if entry["status"] == "ok":
        entry["breakdown"] = step_breakdown(run_steps(entry.get("run_dir")))
        curve = judge_curve(run_steps(entry.get("run_dir")))
        problems = curve.pop("problems")
        entry.update(curve)
        if problems:
            entry.update(status="failed", error="; ".join(problems))
    timing = attention_timing(check.limit(ATTENTION_LIMIT_S), check.cache_dir)
    entry["attention"] = timing
    if timing["status"] == "failed":
        entry.update(status="failed", error="; ".join(filter(None, [entry.get("error"),
                                                                  f"attention timing: {timing['error']}"])))
    return entry


# ------------------------------------------------------------------------------ the check
def _budget_spent(check: Check) -> str:
    return f"the time budget of {check.options.budget_s:.0f} s was spent before it"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:500]
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def section_distributed(check: Check) -> dict[str, Any]:
    from muonlab.doctor.resume import distributed_check  # noqa: PLC0415

    return distributed_check(check.limit(LIMITS_S["distributed"]), check.cache_dir, check.log)


def _section_functions() -> dict[str, Callable[[Check], dict[str, Any]]]:
    # looked up at call time, so that a test can replace one section
    return {"environment": section_environment, "pytest": section_pytest, "throughput": section_throughput,
            "distributed": section_distributed}


def plan(options: GpuCheckOptions) -> dict[str, Any]:
    """The sections the check would run and their limits (no GPU needed): the sum is what the
    check can take, and it must fit the budget."""
    sections = {name: ("skipped" if name in options.skip else LIMITS_S[name]) for name in SECTIONS}
    total = sum(v for v in sections.values() if isinstance(v, float))
    return {"sections": sections, "sum_s": total, "budget_s": options.budget_s, "fits": total <= options.budget_s}


def format_plan(p: dict[str, Any]) -> str:
    lines = ["muonlab doctor --gpu plan (seconds each section may take; none runs now):"]
    lines += [f"  {name:<12} {limit if isinstance(limit, str) else f'{limit:6.0f} s'}"
              for name, limit in p["sections"].items()]
    verdict = "fits" if p["fits"] else "DOES NOT FIT"
    lines.append(f"  {'sum':<12} {p['sum_s']:6.0f} s of a {p['budget_s']:.0f} s budget: {verdict}")
    return "\n".join(lines)


def run_sections(check: Check, after_each: Callable[[], None] = lambda: None) -> dict[str, dict[str, Any]]:
    """Each section in turn within the budget; `after_each` runs after every one (the report is written then,
    so a check stopped part-way leaves what it found)."""
    functions = _section_functions()
    for name in SECTIONS:
        start = time.monotonic()
        if name in check.options.skip:
            result: dict[str, Any] = {"status": "skipped", "reason": "--skip"}
        elif check.remaining() < max(MIN_START_S, min(LIMITS_S[name], check.options.budget_s)):
            result = {"status": "not_run", "reason": _budget_spent(check)}
        else:
            check.log(f"gpu check: {name} ...")
            try:
                result = dict(functions[name](check))
            except Exception as exc:  # a section's own failure: recorded, the next section runs
                result = {"status": "failed", "error": _one_line(exc)}
        result.setdefault("status", "ok")
        result.setdefault("error", None)
        result["seconds"] = round(time.monotonic() - start, 1)
        check.sections[name] = result
        check.log(f"gpu check: {section_line(name, result)}")
        after_each()
    return check.sections


def _json_safe(value: Any) -> Any:
    """Strict JSON: non-finite floats as None (JSON has no NaN), anything else unknown as its str,
    so that what the sections found is always written."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)


def build_report(check: Check) -> dict[str, Any]:
    from muonlab.version import __version__  # noqa: PLC0415

    sections = check.sections
    failed = [n for n, s in sections.items() if s["status"] == "failed"]
    skipped = [n for n, s in sections.items() if s["status"] == "skipped"]
    not_run = [n for n, s in sections.items() if s["status"] == "not_run"]
    env = sections.get("environment") or {}
    return _json_safe({
        "format": FORMAT, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "muonlab_version": __version__,
        # passed: every section that was asked for ran and none failed (a section the budget did not reach, or
        # one cut short, leaves the check incomplete, not passed)
        "options": check.options.to_dict(), "device_name": env.get("device_name"),
        "passed": not failed and not not_run, "complete": not skipped and not not_run, "failed_sections": failed, "skipped_sections": skipped,
        "not_run_sections": not_run, "budget_s": check.options.budget_s,
        "seconds": round(time.monotonic() - check.started, 1), "out": str(check.options.out), "sections": sections,
    })


def run_gpu_check(options: GpuCheckOptions, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Run every section and write the report to options.out (atomically); None, having run
    and written nothing, when CUDA is not available."""
    from muonlab.atomic import write_json  # noqa: PLC0415

    options.validate()
    if not cuda_available():
        return None
    own_dir = options.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="muonlab-gpu-check-")) if own_dir else options.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)  # absolute: the pytest child runs in another folder
    check = Check(options, work_dir, log)

    def write(final: bool = False) -> dict[str, Any]:
        report = build_report(check)
        if not final:  # a section is still to come: what has run so far, never a pass
            pending = [n for n in SECTIONS if n not in check.sections]
            report.update(passed=False, complete=False, pending_sections=pending)
        write_json(options.out, report)
        return report

    try:
        run_sections(check, after_each=write)
        return write(final=True)
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ the summary
def _fmt(value: Any, spec: str, unit: str = "") -> str:
    return "n/a" if not isinstance(value, (int, float)) else f"{value:{spec}}{unit}"


def section_line(name: str, s: dict[str, Any]) -> str:
    head = f"{name:<12} {s['status']:<8} {s.get('seconds', 0):6.1f} s"
    if s["status"] in ("skipped", "not_run"):
        return f"{head}  {s.get('reason')}"
    detail = ""
    if name == "environment" and "device_name" in s:
        fa3 = "FA3 yes" if s["fa3"]["available"] else f"FA3 no ({s['fa3'].get('auto_backend')})"
        detail = (f"{s['device_name']} sm_{''.join(map(str, s['capability']))}, torch {s['torch_version']}, "
                  f"CUDA {s['cuda_version']}, {fa3}, compile {'ok' if s['compile']['ok'] else 'failed'}, "
                  f"triton {s['triton']['version'] or 'missing'}")
    elif name == "pytest" and "passed" in s:
        detail = f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped"
    elif name == "throughput" and s.get("tokens_per_second") is not None:
        detail = (f"{s['preset']} {s['num_steps']} steps on {s.get('attention_backend')}: "
                  f"{_fmt(s['tokens_per_second'], ',.0f')} tok/s, MFU {_fmt(s.get('mfu_percent'), '.1f', '%')} "
                  f"(upstream {UPSTREAM_MFU_PERCENT}% with FA3 on an H100, target "
                  f"{_fmt(s.get('target_mfu_percent'), '.0f', '%')}), peak {_fmt(s.get('peak_vram_mb'), ',.0f', ' MiB')} "
                  f"(upstream {UPSTREAM_PEAK_VRAM_MB:,.0f}), loss {_fmt(s.get('first_loss'), '.3f')} -> "
                  f"{_fmt(s.get('last_loss'), '.3f')}, graphs after warm-up {s.get('graphs_after_warmup')}")
        b = s.get("breakdown")
        if b and b.get("share"):  # where a step's time goes
            m, share = b["median_s"], b["share"]
            detail += (f"; a step {m['dt'] * 1000:,.0f} ms: forward+backward {100 * share['t_forward_backward']:.0f}% "
                       f"(data wait {100 * share['data_wait']:.0f}%), optimizer {100 * share['t_optimizer']:.0f}%, "
                       f"rest {100 * share['t_rest']:.0f}%")
    if name == "throughput" and isinstance(s.get("attention"), dict):
        a = s["attention"]
        detail += "; attention " + (", ".join(f"{n} {ms:.2f} ms" for n, ms in a["median_ms"].items())
                                    if a.get("median_ms") else f"{a['status']} ({a.get('error')})")
    elif name == "distributed" and "runs" in s:
        detail = "; ".join(f"{r['optimizer']} {r['status']}" for r in s["runs"].values())
    text = f"{head}  {detail}" if detail else head
    return f"{text}\n{'':<12} error: {s['error']}" if s.get("error") else text


def format_summary(report: dict[str, Any]) -> str:
    lines = [f"muonlab doctor --gpu on {report.get('device_name') or 'CUDA'}: {report['seconds']:.0f} s "
             f"of a {report['budget_s']:.0f} s budget"]
    lines += [f"  {section_line(name, s)}" for name, s in report["sections"].items()]
    verdict = "passed" if report["passed"] else f"FAILED ({', '.join(report['failed_sections'])})"
    if report["skipped_sections"]:
        verdict += f", skipped: {', '.join(report['skipped_sections'])}"
    if report.get("not_run_sections"):
        verdict += f", not run (budget): {', '.join(report['not_run_sections'])}"
    lines.append(f"result: {verdict}; written to {report['out']}")
    return "\n".join(lines)
