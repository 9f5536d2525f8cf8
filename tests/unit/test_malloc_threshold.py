"""The worker pins glibc's mmap threshold: a large block freed does not move later blocks of
that size onto the brk heap (where freed pages stay resident and the heap creeps)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")

# Frees a 4 MiB block (glibc then raises its threshold past 1 MiB unless pinned), allocates
# 1 MiB, and prints how many bytes glibc holds in mmapped blocks (mallinfo2.hblkhd).
PROBE = """
import ctypes, sys
from outbox.worker.memory import pin_malloc_thresholds
pinned = pin_malloc_thresholds() if sys.argv[1] == "pin" else False
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
before = mallinfo2().hblkhd
big = bytearray(4 << 20)
del big
block = bytearray(1 << 20)
print(pinned, mallinfo2().hblkhd - before)
"""


def probe(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env=clean | env,
        capture_output=True,
        text=True,
        check=True,
    )
    pinned, mapped = done.stdout.split()
    return pinned, int(mapped)


def test_a_pinned_threshold_keeps_large_blocks_off_the_heap() -> None:
    pinned, mapped = probe("pin")
    assert pinned == "True"
    assert 1 << 20 <= mapped < (1 << 20) + (64 << 10)  # the block, mmapped (a page or so more)


def test_unpinned_glibc_moves_them_onto_the_heap() -> None:
    # The behaviour the pin exists for: without it the 1 MiB block is not mmapped.
    assert probe("leave") == ("False", 0)


def test_an_operators_malloc_setting_is_left_alone() -> None:
    pinned, _ = probe("pin", MALLOC_MMAP_THRESHOLD_="262144")
    assert pinned == "False"
