"""A target for a warm child that reports the process it was given (tests/lab/test_warm_start.py)."""

import os


def report(argv, env, log_path):
    from muonlab.lab.warm_start import enter_run

    enter_run(env, log_path)
    import torch

    print(f"threads={torch.get_num_threads()} own_session={os.getsid(0) == os.getpid()} "
          f"var={os.environ.get('WARM_CHILD_VAR')} argv={argv}")
    raise SystemExit(int(argv[0]))
