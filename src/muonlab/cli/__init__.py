"""The `muonlab` command line: argument parsing only; every verb calls a library function.

One module per verb (cli/train.py, cli/sweep.py, ...: its one-line HELP, add_arguments and run), the
top-level parser in cli/parser.py, the flags generated from the config sections in
cli/config_flags.py; what a run's flags resolve to is muonlab.lab.request's. Here: `main`.

Exit status: 0 success, 1 runtime failure (including a diverged run or a failed check),
2 usage error (unknown option, impossible configuration, missing input), 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import sys

from muonlab.cli.parser import build_parser
from muonlab.cli.resolve import _resolve_config
from muonlab.errors import MuonlabError

__all__ = ["main", "build_parser", "_resolve_config"]


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _signal_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # a SLURM preemption or `kill` ends a run like Ctrl-C: recorded, then exit


def _chosen_verb(argv: list[str] | None) -> str | None:
    """The verb the command line names (its first word that is not an option), if any."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words else None


def main(argv: list[str] | None = None) -> int:
    import signal

    # SIGUSR2: SLURM's advance notice (sbatch --signal), whose default action would end the process unrecorded
    stops = [signal.SIGTERM] + ([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else [])
    previous = {sig: signal.signal(sig, _signal_as_interrupt) for sig in stops} if threading_is_main() else {}
    try:
        args = build_parser(argv, only=_chosen_verb(argv) or "").parse_args(argv)
        return args.func(args)
    except MuonlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, a vanished file: the run is already recorded
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line; a run keeps its traceback
        if os.environ.get("MUONLAB_DEBUG"):
            raise
        verb = _chosen_verb(argv) or ""
        where = "a run records the traceback in its ledger line; " if verb in ("train", "sweep") else ""
        print(f"error: {exc.__class__.__name__}: {exc} ({where}MUONLAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
