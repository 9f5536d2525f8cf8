"""The console scripts' entry (`outbox-worker`, `maintenance`): signals held from the first
instant.

Importing the command-line tools (the worker, asyncpg, typer, the app's stack) takes half a
second and more; a supervisor that starts and stops workers quickly signals them meanwhile. So
the handlers go in before any of that is imported: a SIGTERM ends the process at once with exit
0 (nothing is claimed before the service runs), a SIGINT with one line and exit 130, never a
traceback. Once imported, each tool's own `main` takes over with the handlers it always had
(the worker's: stop at once until it serves, then finish the batch; SIGINT: "interrupted",
130). Nothing else lives here: `import outbox` is light (its names load on first use).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

__all__ = ["maintenance", "worker"]


def _hold(prog: str) -> None:
    """SIGTERM: exit 0 at once; SIGINT: one line, exit 130; until the tool's main takes over.
    By `os._exit`, not SystemExit: a signal that lands while the import machinery runs a
    weakref callback (`_get_module_lock`'s) would have its exception printed as "Exception
    ignored" and dropped, and the process would go on to serve. Nothing is open yet to close."""

    def terminated(_signum: int, _frame: FrameType | None) -> None:
        _exit_now(0)

    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        sys.stderr.write(f"{prog}: error: interrupted\n")  # as each main says it
        _exit_now(130)

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, interrupted)


def _exit_now(code: int) -> NoReturn:
    """End the process now, with what it wrote so far flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _release(*, sigterm: bool) -> None:
    """Python's own SIGINT handler back (a KeyboardInterrupt, which each main turns into its
    line and 130), and with `sigterm` the default SIGTERM."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def worker() -> NoReturn:
    """`outbox-worker` (its main keeps SIGTERM's "stop at once" until the service runs)."""
    _hold("outbox-worker")
    from outbox.cli.worker import main

    _release(sigterm=False)
    main()


def maintenance() -> NoReturn:
    """`maintenance`."""
    _hold("maintenance")
    from outbox.cli.maintenance import main

    _release(sigterm=True)
    main()
