"""Tokenizing in worker processes: the training loader's encoding with no GIL shared with the step.

tiktoken's Rust releases the GIL while it merges, but a call still holds it to build the returned list of
Python ints, so encoding threads stop scaling: two threads gave 1.2-1.35x one on a 2-core machine, and on
a 16-core H100 node gpu-d8's loader (8 document batches on 2 threads each, beside the training thread)
made 0.83M tokens/s, so the step waited 0.38 s of its 0.63 s for data (MFU 19.6%, `muonlab doctor --gpu`,
2026-12-06). Worker processes scale with the cores and leave the training process's GIL to the step.

The workers are spawned (never forked: the parent may hold CUDA and threads), and this module imports
only numpy and tiktoken, so a worker starts in a fraction of a second: `muonlab.data` loads its modules
lazily. Each worker builds the same `tiktoken.Encoding` from the tokenizer's pattern and ranks, so the
ids are the ones the loader's own process would make.
"""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import numpy as np
import tiktoken


class EncodingSpec(NamedTuple):
    """What a worker needs to rebuild a BPE tokenizer's encoding (muonlab.data.tokenizer.Tokenizer)."""

    pattern: str
    ranks: list[bytes]  # token bytes, position = rank
    special_tokens: dict[str, int]
    bos_token_id: int


_encoding: tiktoken.Encoding | None = None
_bos: int = 0


def _start_worker(spec: EncodingSpec) -> None:
    global _encoding, _bos  # one encoding per worker process, built once
    _encoding = tiktoken.Encoding(
        name="muonlab-bpe",
        pat_str=spec.pattern,
        mergeable_ranks={tok: rank for rank, tok in enumerate(spec.ranks)},
        special_tokens=spec.special_tokens,
    )
    _bos = spec.bos_token_id


def encode_with_bos(texts: list[str]) -> list[np.ndarray]:
    """Each text's ids as ordinary text, BOS first, int32 (what the packer stores): runs in a worker."""
    out = []
    for text in texts:
        tokens = _encoding.encode_ordinary(text)
        ids = np.empty(len(tokens) + 1, dtype=np.int32)
        ids[0] = _bos
        ids[1:] = tokens
        out.append(ids)
    return out


def main_is_spawn_safe() -> bool:
    """Whether a spawned worker can start here without running the program's own code again.

    A spawned process imports the parent's main module (as `__mp_main__`) before it runs anything:
    harmless for `python -m muonlab` and torchrun's `-m muonlab` (a package's `__main__` is skipped), the
    `muonlab` console script (its call is under `if __name__ == "__main__"`), an interactive session or a
    notebook (no file); a researcher's script that trains at its top level would train again in every
    worker. So `data.encode_processes` left to none starts workers only where this is true."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name == "__main__" or name.endswith(".__main__")
    if getattr(main, "__file__", None) is None:
        return True
    entry = getattr(main, "main", None)  # the console script: `from muonlab.cli import main` under the guard
    return getattr(entry, "__module__", "").startswith("muonlab.cli")


def encoding_pool(spec: EncodingSpec, processes: int) -> ProcessPoolExecutor:
    """`processes` spawned workers, each holding `spec`'s encoding; submit `encode_with_bos` to it."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    return ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(spec,))
