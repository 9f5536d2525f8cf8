"""How the worker service's parts tell each other, and the outside, what happened.

`Doorbell` wakes the claim loops (a NOTIFY rings it, `close()` wakes them for good). `Signal`
and `Signals` report what the service did, so tests and embedding code wait on an event rather
than poll: a LISTEN (re)connect, a committed batch, a loop that found nothing due.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

__all__ = ["Doorbell", "Signal", "Signals"]


class Doorbell:
    """Wakes every waiting claim loop: NOTIFY rings it; `close()` wakes them for good."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.closed = False

    def ring(self) -> None:
        self._event.set()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        if not self.closed:
            self._event = anyio.Event()


class Signal:
    """Something that happens again and again (a batch ends, a loop goes idle). `wait()` waits
    for the next time; `wait_until(check)` returns once `check()` holds, checking now and after
    each time, so nothing that happened before the call is missed."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    async def wait_until(self, check: Callable[[], bool]) -> None:
        while not check():
            await self.wait()


@dataclass
class Signals:
    """What a running service reports (see the module docstring)."""

    listening: Signal = field(default_factory=Signal)  # fired on every LISTEN (re)connect
    batch_done: Signal = field(default_factory=Signal)  # fired after every committed batch
    idle: Signal = field(default_factory=Signal)  # fired when a loop has nothing due now
