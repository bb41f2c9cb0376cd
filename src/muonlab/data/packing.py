"""BOS-aligned best-fit packing of documents into rows of T+1 tokens (upstream's loader).

Each row starts at position 0 and is filled by repeatedly taking the largest buffered
document that fits in the remaining space; when none fits, the shortest buffered
document is cropped to fill the row exactly (its tail is dropped). Every document
starts with BOS, so every row does too, and there is no padding. Before each
placement the buffer is topped up to `buffer_size` documents, tokenizing 128 at a time.

Upstream scans the whole buffer per placement; here the buffer is kept sorted by
(length, arrival), which picks exactly the same document (ties go to the earliest
arrival, as a first-match list scan does) in O(log n) plus a small memmove.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import torch

from muonlab.data.encoded_store import EncodedStore
from muonlab.data.encoding_processes import encode_with_bos, encoding_pool
from muonlab.data.store import DocBatch
from muonlab.errors import UsageError

# documents_factory(start) -> iterable of DocBatch (or plain lists of str), beginning at
# batch index `start`; a factory taking no argument is skipped into with islice.
DocumentsFactory = Callable[..., Iterable["DocBatch | list[str]"]]

_INF = float("inf")


def _open(factory: DocumentsFactory, start: int) -> Iterator:
    try:
        takes_start = len(inspect.signature(factory).parameters) > 0
    except (TypeError, ValueError):
        takes_start = True
    if takes_start:
        return iter(factory(start))
    return itertools.islice(iter(factory()), start, None)


def _encoded(source: Iterator, tokenizer, workers: int, processes: int = 0, store: EncodedStore | None = None
             ) -> Iterator[tuple[object, list]]:
    """(document batch, its token ids, BOS first) in the source's order: the same ids however they are made.

    With `processes`, the next 2 x `processes` batches are encoded at once in worker processes
    (muonlab.data.encoding_processes: no GIL shared with the training thread), for a tokenizer that can
    be rebuilt there (`encoding_spec`); else the next `workers` batches on threads of their own (tiktoken
    releases the GIL while it merges: one batch of 128 documents keeps at most two threads busy). With a
    `store` (a small corpus), a batch whose ids it holds is read from it, and one it lacks is encoded so and
    stored."""
    spec = getattr(tokenizer, "encoding_spec", None) if processes > 0 else None
    pool: ProcessPoolExecutor | ThreadPoolExecutor | None = None
    if spec is not None:
        pool, ahead = encoding_pool(spec(), processes), 2 * processes

        def start(docs):
            return pool.submit(encode_with_bos, docs)
    elif workers > 1:
        pool, ahead = ThreadPoolExecutor(workers, thread_name_prefix="muonlab-encode"), workers

        def start(docs):
            return pool.submit(tokenizer.encode_batch, docs, True)
    else:
        ahead = 1

        def start(docs):
            return tokenizer.encode_batch(docs, prepend_bos=True)

    def submit(item):
        docs = list(item.docs if isinstance(item, DocBatch) else item)
        path, stored = store.read(docs) if store is not None else (None, None)
        return item, path, stored, start(docs) if stored is None else None

    def result(entry):
        item, path, stored, made = entry
        if stored is not None:
            return item, stored
        ids = made.result() if isinstance(made, Future) else made
        if path is not None:
            store.write(path, ids)
        return item, ids

    pending: deque = deque()
    try:
        for item in source:
            pending.append(submit(item))
            if len(pending) >= ahead:
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # what is running ends in a moment; no worker outlives it


def _packer_state(scalars: dict, docs: list[np.ndarray]) -> dict:
    flat = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int32)
    return {
        **scalars,
        "buffer_tokens": torch.from_numpy(flat.astype(np.int32, copy=True)),
        "buffer_lengths": torch.tensor([len(d) for d in docs], dtype=torch.int64),
    }


class RowPacker:
    """Produces packed rows (numpy int64 [T+1]) one at a time; resumable."""

    def __init__(self, documents_factory: DocumentsFactory, tokenizer, T: int, buffer_size: int = 1000,
                 encode_workers: int = 1, encode_processes: int = 0, store: EncodedStore | None = None):
        if T < 1 or buffer_size < 1:
            raise UsageError(f"T and buffer_size must be >= 1, got T={T}, buffer_size={buffer_size}")
        self.factory = documents_factory
        self.tokenizer = tokenizer
        self.capacity = T + 1
        self.buffer_size = buffer_size
        self.encode_workers = encode_workers  # document batches encoded at once, ahead of the packing (same ids)
        self.encode_processes = encode_processes  # > 0: encoded in that many worker processes instead (same ids)
        self.store = store  # a small corpus's batches' ids, read instead of encoded (same ids)
        self.batches_consumed = 0  # document batches taken from the factory so far
        self.rows_produced = 0
        self.epoch = 1  # the epoch of the documents read into the buffer last (it reads ahead)
        # the first epoch's document tokens, complete once the second epoch's first batch arrives:
        # the unit of `trained_epoch`
        self.first_epoch_tokens = 0
        self.tokens_per_epoch: int | None = None
        self.exhausted = False
        self._docs: dict[int, np.ndarray] = {}  # arrival number -> tokens (BOS first)
        self._keys: list[tuple[int, int]] = []  # sorted (length, arrival)
        self._next_arrival = 0
        self._source: Iterator | None = None

    # --- buffer ---------------------------------------------------------------------
    def _refill(self) -> None:
        if self._source is None:
            self._source = _encoded(_open(self.factory, self.batches_consumed), self.tokenizer, self.encode_workers,
                                    self.encode_processes, self.store)
        while len(self._keys) < self.buffer_size and not self.exhausted:
            item, encoded = next(self._source, (None, None))
            if item is None:
                self.exhausted = True
                return
            self.batches_consumed += 1
            if isinstance(item, DocBatch):
                self.epoch = item.epoch
            if self.epoch > 1 and self.tokens_per_epoch is None:
                self.tokens_per_epoch = self.first_epoch_tokens
            keys = self._keys
            for ids in encoded:
                if self.epoch == 1:
                    self.first_epoch_tokens += len(ids)
                arrival = self._next_arrival
                self._next_arrival += 1
                self._docs[arrival] = np.asarray(ids, dtype=np.int32)
                keys.append((len(ids), arrival))
            keys.sort()  # timsort on an already sorted prefix: cheap

    def _take(self, remaining: int) -> tuple[np.ndarray, bool]:
        """Pop the best-fit document for `remaining` slots; True if it must be cropped."""
        keys = self._keys
        i = bisect.bisect_right(keys, (remaining, _INF))
        if i > 0:
            length = keys[i - 1][0]
            j = bisect.bisect_left(keys, (length, -1))  # earliest arrival of that length
            _, arrival = keys.pop(j)
            return self._docs.pop(arrival), False
        _, arrival = keys.pop(0)  # nothing fits: crop the shortest (earliest arrival)
        return self._docs.pop(arrival), True

    def close(self) -> None:
        """Stop encoding ahead (its threads or worker processes end); the next row reads on from the
        document batch the buffer reached, as after `load_state_dict`."""
        if self._source is not None:
            self._source.close()
            self._source = None

    # --- rows -----------------------------------------------------------------------
    def next_row(self) -> np.ndarray | None:
        """The next packed row, or None once a finite document stream is used up.

        A row that cannot be completed at the end of a finite stream is dropped.
        """
        cap = self.capacity
        row = np.empty(cap, dtype=np.int64)
        pos = 0
        while pos < cap:
            if len(self._keys) < self.buffer_size:
                self._refill()
                if not self._keys:
                    return None
            remaining = cap - pos
            doc, crop = self._take(remaining)
            n = remaining if crop else len(doc)
            row[pos : pos + n] = doc[:n]
            pos += n
        self.rows_produced += 1
        return row

    @property
    def trained_epoch(self) -> int:
        """The pass over the corpus the rows produced so far reach (1-based): their tokens over one
        epoch's tokens, once an epoch is known to have ended; 1 before that. Not `epoch`, which is
        the buffer's read-ahead (a 1000-document buffer holds several epochs of a small corpus)."""
        if not self.tokens_per_epoch:
            return 1
        return 1 + (self.rows_produced * self.capacity) // self.tokens_per_epoch

    def skip_rows(self, n: int) -> int:
        """Produce and discard up to `n` rows; return how many were skipped."""
        for k in range(n):
            if self.next_row() is None:
                return k
        return n

    # --- resume ---------------------------------------------------------------------
    def snapshot(self) -> Callable[[], dict]:
        """The state now, made into `state_dict()`'s dict only when called: the buffered documents are
        referenced, not copied (a document's array is never changed once buffered), so a prefetching worker
        can take one after every batch without copying the buffer (tens of MB of a corpus of long files)
        under the GIL that the training thread needs."""
        docs = [self._docs[a] for a in sorted(self._docs)]
        scalars = {
            "version": 1,
            "T": self.capacity - 1,
            "buffer_size": self.buffer_size,
            "batches_consumed": self.batches_consumed,
            "rows_produced": self.rows_produced,
            "epoch": self.epoch,
            "first_epoch_tokens": self.first_epoch_tokens,
            "tokens_per_epoch": self.tokens_per_epoch,
            "exhausted": self.exhausted,
        }
        return functools.partial(_packer_state, scalars, docs)

    def state_dict(self) -> dict:
        return self.snapshot()()

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != 1:
            raise UsageError(f"unknown loader state version {state.get('version')!r}")
        for key, mine in (("T", self.capacity - 1), ("buffer_size", self.buffer_size)):
            if int(state[key]) != mine:
                raise UsageError(f"loader state has {key}={int(state[key])}, this loader has {mine}")
        self.batches_consumed = int(state["batches_consumed"])
        self.rows_produced = int(state["rows_produced"])
        self.epoch = int(state["epoch"])
        self.first_epoch_tokens = int(state.get("first_epoch_tokens", 0))  # absent in older checkpoints
        self.tokens_per_epoch = state.get("tokens_per_epoch")
        self.exhausted = bool(state["exhausted"])
        flat = state["buffer_tokens"].numpy().astype(np.int32)
        lengths = state["buffer_lengths"].tolist()
        self._docs, self._keys, self._next_arrival = {}, [], 0
        offset = 0
        for length in lengths:  # stored in arrival order; renumbering keeps that order
            self._docs[self._next_arrival] = flat[offset : offset + length].copy()
            self._keys.append((length, self._next_arrival))
            self._next_arrival += 1
            offset += length
        self._keys.sort()
        self._source = None  # reopened lazily at batches_consumed


class BestFitLoader:
    """Iterator of (inputs, targets, epoch): int64 tensors [B, T] of packed rows.

    Rows are produced one at a time, so the row stream does not depend on B. With
    `world_size` W, the global stream is cut into blocks of B rows and rank r keeps blocks
    r, r+W, r+2W, ...: rank r's k-th batch is the single-process batch k*W + r, so a W-rank
    step sees the same micro-batches as one process (bit-identical per micro-batch). A finite
    document stream ends with a final, possibly smaller batch.
    """

    def __init__(
        self,
        documents_factory: DocumentsFactory,
        tokenizer,
        B: int,
        T: int,
        buffer_size: int = 1000,
        device: str | torch.device = "cpu",
        rank: int = 0,
        world_size: int = 1,
        encode_workers: int = 1,
        encode_processes: int = 0,
        store: EncodedStore | None = None,
    ):
        if B < 1:
            raise UsageError(f"batch size B must be >= 1, got {B}")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.B, self.T = B, T
        self.device = torch.device(device)
        self.rank, self.world_size = rank, world_size
        self.packer = RowPacker(documents_factory, tokenizer, T, buffer_size, encode_workers, encode_processes, store)

    def __iter__(self) -> "BestFitLoader":
        return self

    def _own_row(self) -> np.ndarray | None:
        # Rows of other ranks are packed and dropped: the stream is sequential by nature.
        packer = self.packer
        while True:
            index = packer.rows_produced
            row = packer.next_row()
            if row is None or (index // self.B) % self.world_size == self.rank:
                return row

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        rows = []
        for _ in range(self.B):
            row = self._own_row()
            if row is None:
                break
            rows.append(row)
        if not rows:
            raise StopIteration
        batch = torch.from_numpy(np.stack(rows))
        x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        if self.device.type == "cuda":  # pinned host memory lets the copy overlap compute
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            x, y = x.to(self.device), y.to(self.device)
        return x, y, self.packer.trained_epoch

    def close(self) -> None:
        """Stop the packer's encoding ahead (RowPacker.close); iterating again goes on where it was."""
        self.packer.close()

    def snapshot(self) -> Callable[[], dict]:
        """`state_dict()` now, made when called (RowPacker.snapshot)."""
        packer_state, rank, world_size = self.packer.snapshot(), self.rank, self.world_size
        return lambda: {**packer_state(), "rank": rank, "world_size": world_size}

    def state_dict(self) -> dict:
        return self.snapshot()()

    def load_state_dict(self, state: dict) -> None:
        if (int(state.get("rank", 0)), int(state.get("world_size", 1))) != (self.rank, self.world_size):
            raise UsageError("loader state was saved for a different rank/world_size")
        self.packer.load_state_dict(state)
