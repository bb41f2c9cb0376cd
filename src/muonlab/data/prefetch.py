"""A loader's batches made ahead of the step that takes them, in a thread of their own.

Upstream tokenizes and packs between steps, in the training thread: at gpu-d8's 524,288 tokens a step the
GPU waits for it (tiktoken's `encode_batch` is most of a 2-core machine's 2.6-4.5 s per step). Here a
worker thread runs the loader `depth` batches ahead; tiktoken's Rust releases the GIL and the training
thread spends a CUDA step waiting on the device, so the two overlap. The batches are the wrapped loader's,
in its order: the numbers do not change.

Resuming stays exact: the worker snapshots the loader's state after each batch it makes, and `state_dict`
returns the snapshot of the last batch handed out, not of the batches still queued. `waited` counts the
batches the consumer had to wait for (the queue was empty when it asked): after the first, 0 when the loader
keeps ahead of the step.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

_END = object()
_PUT_TIMEOUT_S = 0.1  # how often a worker blocked on a full queue looks whether it was stopped


class PrefetchLoader:
    """Iterator of the wrapped loader's items, made `depth` ahead by a daemon thread; resumable."""

    def __init__(self, loader: Any, depth: int = 4):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.loader, self.depth = loader, depth
        self.waited = 0  # items the consumer had to wait for
        self.handed = 0  # items handed out
        # the loader's state after the last item handed out: a dict, or a snapshot that makes one when called
        self._state: dict | Callable[[], dict] | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self.depth)
        self._stop.clear()
        self._thread = threading.Thread(target=self._work, name="muonlab-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        q = self._queue
        try:
            # a loader's snapshot is made into its state dict only when asked (a checkpoint), not per batch
            take = getattr(self.loader, "snapshot", None) or getattr(self.loader, "state_dict", None)
            for item in self.loader:
                snapshot = take() if take is not None else None
                while not self._stop.is_set():
                    try:
                        q.put((item, snapshot), timeout=_PUT_TIMEOUT_S)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._put_end(_END)
        except BaseException as exc:  # the consumer raises it in its own thread
            self._put_end(exc)

    def _put_end(self, value) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put((value, None), timeout=_PUT_TIMEOUT_S)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        if self._thread is None:
            self._start()
        if self._queue.empty():
            self.waited += 1
        item, snapshot = self._queue.get()
        if item is _END:
            self._queue.put((_END, None))  # a later call ends too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        self.handed += 1
        self._state = snapshot
        return item

    def state_dict(self) -> dict:
        """The wrapped loader's state after the last item handed out (before any: its state now)."""
        state = self._state
        if state is None:
            return self.loader.state_dict()
        return state() if callable(state) else state

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.loader.load_state_dict(state)
        self._state = None

    def close(self) -> None:
        """Stop the worker (it ends once the item it is making is made) and drop what it made ahead: the wrapped loader
        goes back to the last item handed out and is closed, so iterating again goes on from there."""
        if self._thread is not None:
            self._stop.set()
            self._drain()  # a put blocked on the full queue returns now, not at its timeout (a run's end waited it)
            self._thread.join()
            self._thread = None
            self._queue = None
            if self._state is not None:
                self.loader.load_state_dict(self.state_dict())
        if hasattr(self.loader, "close"):  # its encoding ahead too (a packer's worker processes)
            self.loader.close()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __getattr__(self, name: str):  # the wrapped loader's own attributes (packer, B, T, ...)
        if name in ("loader",):
            raise AttributeError(name)
        return getattr(self.loader, name)
