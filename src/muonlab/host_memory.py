"""The C allocator of a run that computes on the host (a CPU run).

glibc's malloc serves a block over its mmap threshold (32 MB at most) by a fresh mapping and unmaps it when
freed, and trims the top of its heap once 128 KB is free there: every step of a CPU run then gets its large
tensors (a tied head's logits: 1,024 tokens x 16,385 colours x 4 bytes is 67 MB) as new pages, which the
kernel faults in and zeroes one by one. On a 2-core machine that was a third of an imagegpt-cpu run's time
(3.4 million page faults, 7 of 21 s in the kernel). Keeping freed memory in the process for the next step
takes the kernel out (0.2 million faults, 14 s), at the cost of a peak resident size held to the run's end
(+29% there). Where each tensor lies changes no number: torch aligns every CPU tensor to 64 bytes either way
(the run's weights were bit for bit the same).

Only glibc's malloc is tuned; a user who set its tunables (GLIBC_TUNABLES, MALLOC_*) keeps them.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, glibc's malloc.h
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes (an int)


def is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # not a GNU system (macOS, Windows, musl)
        return False


def user_tuned() -> bool:
    """The user gave glibc's allocator settings of their own."""
    return any(name == "GLIBC_TUNABLES" or name.startswith("MALLOC_") for name in os.environ)


def retain_freed_host_memory() -> bool:
    """From now on this process's malloc reuses the memory a freed tensor held instead of returning it to
    the kernel (no mapping per large block, no trim). True when set (glibc, not already tuned by the user);
    the setting lasts the process's life and is inherited by a fork; setting it again changes nothing."""
    if not is_glibc() or user_tuned():
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
