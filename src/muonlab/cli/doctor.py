"""`muonlab doctor --gpu`: the acceptance checks of this machine's GPU (--plan: their time limits)."""

from __future__ import annotations

import argparse
import json

from muonlab.cli.parser import _emit, _log_for
from muonlab.errors import UsageError
from muonlab.settings import comma_items, finite_number, integer_at_least

HELP = "acceptance checks of this machine: --gpu checks every CUDA path in ~8 minutes"
DESCRIPTION = """Acceptance checks of this machine.

--gpu runs, within --budget-s (8 minutes, sized for one H100/H200 from a cold start), four
sections and writes one JSON file (--out): environment (device, capability, torch/CUDA/driver
versions, FlashAttention-3, Triton, torch.compile), pytest (`pytest -m gpu` over the test files
holding gpu tests: attention kernels against fp32, compiled against eager, the LMO), throughput
(a compiled 50-step gpu-d8 run whose loss must fall with no recompile after warm-up: tokens/s,
MFU and peak memory beside upstream's) and distributed (a 1-GPU torchrun of both distributed
optimizers on NCCL: checkpoint, resume, continuation). Runs train on the embedded stdlib corpus
(no network). A failed section does not stop the others; one the budget did not reach is "not
run". Exit 0 when none failed, 1 otherwise. --plan prints the sections' limits and their sum
(no GPU needed). Without CUDA it prints one line, runs nothing, writes no file (even with
--out) and exits 0. benchmarks/gpu_acceptance.sh runs it from a checkout on a GPU image."""
PARSER = dict(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_arguments(p, context) -> None:
    from muonlab.doctor.gpu import DEFAULT_BUDGET_S, DEFAULT_OUT, SECTIONS

    p.add_argument("--gpu", action="store_true", help="check every CUDA path on this machine's GPU")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="PATH",
                   help=f"the JSON report, written atomically (default ./{DEFAULT_OUT}; never written without CUDA)")
    p.add_argument("--tests", default=None, metavar="PATH",
                   help="the tests folder `pytest -m gpu` runs (default: the checkout's tests/)")
    p.add_argument("--budget-s", type=finite_number(0, above=True), default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"time budget of the whole check; each section's limit is cut to what is left "
                        f"(default {DEFAULT_BUDGET_S:.0f})")
    p.add_argument("--skip", default="", metavar="SECTIONS",
                   help=f"comma-separated sections not to run: {', '.join(SECTIONS)}")
    p.add_argument("--pytest-workers", type=integer_at_least(0), default=None, metavar="N",
                   help="pytest-xdist workers sharing the GPU (default 4 with pytest-xdist on a shared GPU, else 1)")
    p.add_argument("--require-fa3", action="store_true",
                   help="fail the environment section when FlashAttention-3 cannot be loaded (default: a warning)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="keep the runs, their cache and the pytest report here (default: a temporary folder, removed)")
    p.add_argument("--plan", action="store_true",
                   help="print the sections, their time limits and their sum against the budget; run nothing "
                        "(exit 1 when they do not fit)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the summary")


def run(args) -> int:
    from muonlab.doctor import gpu

    if not args.gpu:
        raise UsageError("say what to check: --gpu (the only check so far)")
    options = gpu.GpuCheckOptions(out=args.out, tests=args.tests, budget_s=args.budget_s,
                                  skip=tuple(comma_items(args.skip, "--skip")),
                                  pytest_workers=args.pytest_workers, require_fa3=args.require_fa3,
                                  work_dir=args.work_dir)
    if args.plan:  # no GPU needed: what would run, and whether it fits
        planned = gpu.plan(options.validate())
        _emit(args, planned, gpu.format_plan(planned))
        return 0 if planned["fits"] else 1
    report = gpu.run_gpu_check(options, log=_log_for(args))
    if report is None:  # no CUDA: one line, nothing run, nothing written
        print(json.dumps({"cuda_available": False, "ran": False, "message": gpu.NO_CUDA_LINE})
              if args.json else gpu.NO_CUDA_LINE)
        return 0
    _emit(args, report, gpu.format_summary(report))
    return 0 if report["passed"] else 1
