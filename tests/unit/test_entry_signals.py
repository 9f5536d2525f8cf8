"""The console scripts' start-up handlers end the process even when the signal lands inside a
weakref callback (the import machinery runs them): an exception raised there would be printed
as "Exception ignored" and dropped, and the worker would go on to serve (S12)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, weakref
{install}
class Thing:
    pass
def callback(_ref):
    os.kill(os.getpid(), signal.{signum})
    for _ in range(100_000):  # the handler runs here, inside the callback
        pass
thing = Thing()
ref = weakref.ref(thing, callback)
del thing
print("went on", flush=True)
"""
HOLD = "from outbox._entry import _hold; _hold('outbox-worker')"
BEFORE_SERVING = (
    "from outbox.cli.worker import _stopped_before_serving; "
    "signal.signal(signal.SIGTERM, _stopped_before_serving)"
)


@pytest.mark.parametrize(
    ("install", "signum", "code", "line"),
    [
        (HOLD, "SIGTERM", 0, ""),
        (HOLD, "SIGINT", 130, "outbox-worker: error: interrupted\n"),
        (BEFORE_SERVING, "SIGTERM", 0, ""),
    ],
    ids=["hold-SIGTERM", "hold-SIGINT", "main-SIGTERM"],
)
def test_a_signal_inside_a_weakref_callback_still_ends_start_up(
    install: str, signum: str, code: int, line: str
) -> None:
    assert hasattr(signal, signum)
    script = SCRIPT.format(install=install, signum=signum)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout == ""  # it did not go on
    assert done.stderr == line
    assert done.returncode == code
