"""`muonlab doctor --gpu`: every CUDA path of muonlab checked on one GPU, within a time budget
(8 minutes by default, an H100's worth), into one JSON file.

Sections, in order, each recorded as ok / failed (with its error) / skipped (with its reason),
with its duration and limit; a section that fails does not stop the others:
1. environment: CUDA device, capability, torch / CUDA / driver versions, FlashAttention-3 (the
   backend `auto` resolves to; the reason when it cannot load), Triton, and a tiny function
   run through torch.compile in a child process.
2. pytest: `pytest -m gpu` over the tests folder (the tests of tests/test_gpu_acceptance.py and
   every other gpu-marked test), its counts read from a JUnit XML report.
3. throughput: a compiled 50-step gpu-d8 run: tokens/s, MFU and peak memory beside upstream's
   published MFU and the target on an H100.
4. presets: a compiled 20-step run of every preset that targets a GPU (muonlab.doctor.selection):
   status, step time, finite loss. gpu-d8's entry is the throughput run (50 steps, a superset).

Every section's limit is cut to what is left of the budget; one that cannot start is failed
("not run"). The exit status is 0 when no section failed, 1 otherwise. Without CUDA nothing is
run and nothing is written (run_gpu_check returns None).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import platform
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from muonlab.doctor.runs import child_env, last_line, run_process, training_run
from muonlab.errors import UsageError

FORMAT = "muonlab-gpu-check/1"
SECTIONS = ("environment", "pytest", "throughput", "presets")
DEFAULT_OUT = "gpu_check.json"
DEFAULT_BUDGET_S = 480.0  # 8 minutes on one H100-class GPU
# Each section's own limit (seconds), cut to what is left of the budget. Estimates on an H100:
# environment ~20 s (the compile probe), pytest ~90 s with 4 workers, the 50-step gpu-d8 run
# ~70 s (compile ~30 s, then ~0.3 s a step as upstream), a 20-step preset run ~40-80 s.
LIMITS_S = {"environment": 150.0, "pytest": 240.0, "throughput": 180.0, "preset_run": 120.0}
MIN_START_S = 20.0  # a section or run given less than this is not started
NO_CUDA_LINE = "CUDA is not available: the GPU check ran nothing and wrote no file"

THROUGHPUT_PRESET, THROUGHPUT_STEPS, PRESET_STEPS = "gpu-d8", 50, 20
# Upstream's published baseline: karpathy/autoresearch program.md (commit 228791f), "Output
# format", the summary of the depth-8 baseline run (`mfu_percent: 39.80`, 953 steps in 300.1 s,
# peak_vram_mb 45060.2); its README: "tested on H100". MFU over 989.5 TFLOP/s dense bf16.
UPSTREAM_MFU_PERCENT = 39.8
TARGET_MFU_PERCENT = 45.0  # muonlab's target for gpu-d8 on an H100 (reported, not enforced)


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

    from muonlab import __version__  # noqa: PLC0415
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
        f"FlashAttention-3 does not load, runs use SDPA: {env['fa3']['error']}"]
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
    return 4 if mode == "Default" else 1  # an exclusive-process GPU takes one process


PER_TEST_TIMEOUT_S = 150  # pytest-timeout: a hung test fails alone and the report is still written


def pytest_command(tests: Path, junit: Path, workers: int, paths: list[str] | None = None) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        argv.append(f"--timeout={PER_TEST_TIMEOUT_S}")
    if workers > 1:
        argv += ["-n", str(workers)]
    return argv + (paths or [str(tests.resolve())])


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


def section_throughput(check: Check) -> dict[str, Any]:
    entry = training_run(THROUGHPUT_PRESET, THROUGHPUT_STEPS, check.limit(LIMITS_S["throughput"]), check.cache_dir)
    mfu = entry.get("mfu_percent")
    entry.update(upstream_mfu_percent=UPSTREAM_MFU_PERCENT, target_mfu_percent=TARGET_MFU_PERCENT,
                 meets_target=(mfu >= TARGET_MFU_PERCENT) if isinstance(mfu, (int, float)) else None)
    return entry


def section_presets(check: Check) -> dict[str, Any]:
    from muonlab.doctor.selection import gpu_presets  # noqa: PLC0415

    runs: dict[str, dict[str, Any]] = {}
    for name in gpu_presets():
        earlier = check.sections.get("throughput") or {}
        if name == THROUGHPUT_PRESET and "command" in earlier:  # that run was made: not twice
            runs[name] = {**{k: v for k, v in earlier.items() if k not in ("upstream_mfu_percent",
                                                                           "target_mfu_percent", "meets_target")},
                          "same_run_as": "throughput"}
            continue
        if check.remaining() < MIN_START_S:
            runs[name] = {"preset": name, "status": "failed", "error": _budget_spent(check)}
            continue
        check.log(f"  presets: {name}, {PRESET_STEPS} steps (limit {check.limit(LIMITS_S['preset_run']):.0f} s)")
        runs[name] = training_run(name, PRESET_STEPS, check.limit(LIMITS_S["preset_run"]), check.cache_dir)
    failed = [f"{n} ({r['error']})" for n, r in runs.items() if r["status"] != "ok"]
    return {"status": "failed" if failed else "ok", "error": "; ".join(failed) or None, "num_steps": PRESET_STEPS,
            "runs": runs}


# ------------------------------------------------------------------------------ the check
def _budget_spent(check: Check) -> str:
    return f"not run: the time budget of {check.options.budget_s:.0f} s was spent"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:500]
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _section_functions() -> dict[str, Callable[[Check], dict[str, Any]]]:
    # looked up at call time, so that a test can replace one section
    return {"environment": section_environment, "pytest": section_pytest, "throughput": section_throughput,
            "presets": section_presets}


def run_sections(check: Check) -> dict[str, dict[str, Any]]:
    functions = _section_functions()
    for name in SECTIONS:
        start = time.monotonic()
        if name in check.options.skip:
            result: dict[str, Any] = {"status": "skipped", "reason": "--skip"}
        elif check.remaining() < MIN_START_S:
            result = {"status": "failed", "error": _budget_spent(check)}
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
    from muonlab import __version__  # noqa: PLC0415

    sections = check.sections
    failed = [n for n, s in sections.items() if s["status"] == "failed"]
    skipped = [n for n, s in sections.items() if s["status"] == "skipped"]
    env = sections.get("environment") or {}
    return _json_safe({
        "format": FORMAT, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "muonlab_version": __version__,
        "options": check.options.to_dict(), "device_name": env.get("device_name"), "passed": not failed,
        "complete": not skipped, "failed_sections": failed, "skipped_sections": skipped, "budget_s": check.options.budget_s,
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
    try:
        run_sections(check)
        report = build_report(check)
        write_json(options.out, report)
        return report
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ the summary
def _fmt(value: Any, spec: str, unit: str = "") -> str:
    return "n/a" if not isinstance(value, (int, float)) else f"{value:{spec}}{unit}"


def _run_text(run: dict[str, Any]) -> str:
    if run["status"] != "ok":
        return f"{run.get('preset')} failed"
    return f"{run['preset']} ok {_fmt(run.get('step_seconds'), '.3f', ' s/step')}"


def section_line(name: str, s: dict[str, Any]) -> str:
    head = f"{name:<12} {s['status']:<8} {s.get('seconds', 0):6.1f} s"
    if s["status"] == "skipped":
        return f"{head}  {s.get('reason')}"
    detail = ""
    if name == "environment" and "device_name" in s:
        fa3 = "FA3 yes" if s["fa3"]["available"] else "FA3 no (SDPA)"
        detail = (f"{s['device_name']} sm_{''.join(map(str, s['capability']))}, torch {s['torch_version']}, "
                  f"CUDA {s['cuda_version']}, {fa3}, compile {'ok' if s['compile']['ok'] else 'failed'}, "
                  f"triton {s['triton']['version'] or 'missing'}")
    elif name == "pytest" and "passed" in s:
        detail = f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped"
    elif name == "throughput" and s.get("tokens_per_second") is not None:
        detail = (f"{s['preset']} {s['num_steps']} steps: {_fmt(s['tokens_per_second'], ',.0f')} tok/s, "
                  f"MFU {_fmt(s.get('mfu_percent'), '.1f', '%')} (upstream {UPSTREAM_MFU_PERCENT}%, "
                  f"target {TARGET_MFU_PERCENT:.0f}%), peak {_fmt(s.get('peak_vram_mb'), ',.0f', ' MiB')}")
    elif name == "presets" and "runs" in s:
        detail = "; ".join(_run_text(r) for r in s["runs"].values())
    text = f"{head}  {detail}" if detail else head
    return f"{text}\n{'':<12} error: {s['error']}" if s.get("error") else text


def format_summary(report: dict[str, Any]) -> str:
    lines = [f"muonlab doctor --gpu on {report.get('device_name') or 'CUDA'}: {report['seconds']:.0f} s "
             f"of a {report['budget_s']:.0f} s budget"]
    lines += [f"  {section_line(name, s)}" for name, s in report["sections"].items()]
    verdict = "passed" if report["passed"] else f"FAILED ({', '.join(report['failed_sections'])})"
    if report["skipped_sections"]:
        verdict += f", skipped: {', '.join(report['skipped_sections'])}"
    lines.append(f"result: {verdict}; written to {report['out']}")
    return "\n".join(lines)
