"""A stop signal noted where it was taken, so that it outlives the exception it raised.

The command line turns SIGTERM, SIGUSR2 and SIGINT into KeyboardInterrupt (muonlab.cli): Python runs the handler
wherever the main thread is, and that can be inside C code calling back into Python that discards the exception. A
SIGTERM taken as numpy's Generator.choice called its np.prod dispatcher (the synthetic corpus's word draw) was lost
so: the run built its whole corpus, trained and ended 0. The handler notes the signal before it raises; work with
places to stop calls `stop_if_requested()` there (between the steps of building a corpus, at the end of the data
phase), which raises the interrupt again when it was lost and does nothing otherwise."""

from __future__ import annotations

_requested: str | None = None


def note(signal_name: str) -> None:
    """A handler took `signal_name` (and raises KeyboardInterrupt, which may yet be lost)."""
    global _requested
    _requested = signal_name


def clear() -> None:
    """The command that took the signal has ended (a process that runs several, as the tests do, starts afresh)."""
    global _requested
    _requested = None


def stop_if_requested() -> None:
    """Raise the interrupt of a stop signal taken earlier: a place where the work may stop."""
    if _requested is not None:
        raise KeyboardInterrupt(f"interrupted ({_requested})")
