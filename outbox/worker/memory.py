"""Keep a long-running worker's heap from creeping: glibc's dynamic mmap threshold.

glibc serves a block of 128 KiB or more with an mmap of its own, and when such a block is freed
it raises that threshold to the block's size (up to 32 MiB), and the trim threshold to twice
it. From then on blocks of that size come from the brk heap, whose freed middle pages stay
resident. A worker frees such blocks batch after batch, all day: in `make soak` the worker's
heap mapping grew about 0.4 MiB a minute while the bytes malloc held live (heaptrack) and
Python's own objects (tracemalloc) stayed flat. Pinning the threshold at its default, as
`MALLOC_MMAP_THRESHOLD_=131072` in the environment would, turns the adjustment off; the
worker's RSS then levels off within minutes.

Only the `outbox-worker` process does this (an application embedding a worker keeps its
allocator as it is), only on glibc, and never over an operator's own `MALLOC_*` setting.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["MMAP_THRESHOLD", "pin_malloc_thresholds"]

MMAP_THRESHOLD = 128 * 1024  # glibc's own default, kept instead of raised
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def pin_malloc_thresholds() -> bool:
    """Turn glibc's dynamic mmap threshold off; True when this call did it (False: not glibc,
    or the environment already sets it)."""
    if platform.libc_ver()[0] != "glibc" or any(k in os.environ for k in _OPERATOR_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: glibc's
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
