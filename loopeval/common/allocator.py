"""Keeping freed memory in the process for work that allocates large tensors over and over.

glibc hands a freed block above its mmap threshold back to the kernel, and trims the top
of the heap once enough of it is free; the next tensor of that size then faults in fresh
pages that the kernel zeroes first. The placement search allocates and frees tens of
megabytes per layer call and per logits chunk: on SmolLM2-135M (one thread) 7.6 of its
71 s went to the kernel, and keeping freed memory cut the search from 65 s to 60 s
(docs/benchmarks.md, "Placement at the cost of its passes").
"""

from __future__ import annotations

import contextlib
import ctypes
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20
"""glibc's largest mmap threshold on 64-bit: blocks up to 32 MiB come from the heap and are reused."""
TOP_PAD = 256 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory() -> bool:
    """Serve blocks up to 32 MiB from the heap and never trim it, for the rest of this
    process (its resident memory then stays at its peak). Returns whether the setting
    applied: not off glibc, and not when the user set glibc's ``MALLOC_*`` variables."""
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(option, value) == 1 for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, TOP_PAD)))
    return False
