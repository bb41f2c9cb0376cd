"""The `muonlab` command line: argument parsing only; every verb calls a library function.

One module per verb (cli/train.py, cli/sweep.py, ...: its one-line HELP, add_arguments and run), the
top-level parser in cli/parser.py, the flags generated from the config sections in
cli/config_flags.py; what a run's flags resolve to is muonlab.lab.request's. Here: `main`.

Exit status: 0 success, 1 runtime failure (including a diverged run or a failed check),
2 usage error (unknown option, impossible configuration, missing input), 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sys

from muonlab import stop_request
from muonlab.cli.parser import build_parser
from muonlab.cli.resolve import _resolve_config
from muonlab.errors import MuonlabError, UsageError

__all__ = ["main", "build_parser", "_resolve_config"]


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _signal_as_interrupt(signum, frame):
    stop_request.note(signal.Signals(signum).name)  # kept should C code discard the exception (muonlab.stop_request)
    raise KeyboardInterrupt  # a SLURM preemption, a `kill` or Ctrl-C ends a run: recorded, then exit


def _chosen_verb(argv: list[str] | None) -> str | None:
    """The verb the command line names (its first word that is not an option), if any."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words else None


def _one_line(exc: BaseException) -> str:
    """An error's message as the one line the contract promises (a message may hold newlines: a plug-in's)."""
    return " ".join(str(exc).split())


def main(argv: list[str] | None = None) -> int:
    # SIGUSR2: SLURM's advance notice (sbatch --signal), whose default action would end the process unrecorded
    stops = [signal.SIGTERM] + ([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else [])
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Ctrl-C (a sweep's, to its runs) alike;
        stops.append(signal.SIGINT)  # a process that started with it ignored (a background job) keeps it so
    previous = {sig: signal.signal(sig, _signal_as_interrupt) for sig in stops} if threading_is_main() else {}
    try:
        words = sys.argv[1:] if argv is None else argv
        if words and words[0].startswith("-") and words[0] not in ("-h", "--help", "--version"):
            raise UsageError(f"unknown option {words[0]} before the verb (muonlab --help lists the verbs; "
                             "muonlab VERB --help its options)")
        args = build_parser(argv, only=_chosen_verb(argv) or "").parse_args(argv)
        return args.func(args)
    except MuonlabError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, a vanished file: the run is already recorded
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        verb = _chosen_verb(argv) or ""
        after = {"train": ": the run is recorded interrupted; where its ledger line says resumable, `muonlab train "
                          "--resume RUN_DIR` continues it",
                 "sweep": ": its runs are recorded interrupted; the same sweep command again resumes them",
                 "paper": ": its runs are recorded interrupted; the same command again resumes them"}.get(verb, "")
        print(f"error: interrupted{after}", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line; a run keeps its traceback
        if os.environ.get("MUONLAB_DEBUG"):
            raise
        verb = _chosen_verb(argv) or ""
        where = "a run records the traceback in its ledger line; " if verb in ("train", "sweep") else ""
        print(f"error: {exc.__class__.__name__}: {_one_line(exc)} ({where}MUONLAB_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if previous:
            stop_request.clear()
