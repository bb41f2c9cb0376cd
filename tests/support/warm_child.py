"""A target for a warm child that reports the process it was given (tests/lab/test_warm_start.py)."""

import os


def report(argv, env, log_path):
    from muonlab.lab.warm_start import enter_run

    enter_run(env, log_path)
    import torch

    print(f"threads={torch.get_num_threads()} own_session={os.getsid(0) == os.getpid()} "
          f"var={os.environ.get('WARM_CHILD_VAR')} argv={argv}")
    raise SystemExit(int(argv[0]))


def imports_of_a_run(argv, env, log_path):
    """Run `muonlab <argv>` as a warm child does, then report, one line each: the server's objects frozen out of
    the garbage collector (gc.get_freeze_count()), and the muonlab modules and the installed packages the run
    imported that the server had not (a package's submodules loaded on use, as torch's, and the standard library
    not counted)."""
    import gc
    import sys

    from muonlab.lab.warm_start import _train

    frozen, before = gc.get_freeze_count(), set(sys.modules)
    try:
        _train(argv, env, log_path)
    except SystemExit as exc:
        if exc.code:
            raise
    packages = {name.split(".")[0] for name in before}
    new = sorted(name for name in set(sys.modules) - before
                 if name.startswith("muonlab.") or name.split(".")[0] not in {*packages, *sys.stdlib_module_names})
    print(f"frozen={frozen}\nimported={','.join(new)}", flush=True)


def prints_a_line(argv, env, log_path):
    """Print a line, then the bytes of it that reached the log file by then (0 while buffered)."""
    from muonlab.lab.warm_start import enter_run

    enter_run(env, log_path)
    print("ready")
    written = os.fstat(1).st_size
    print(f"written={written}")
