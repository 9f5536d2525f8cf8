"""How the worker service's parts tell each other, and the outside, what happened.

`Doorbell` wakes the claim loops (a NOTIFY wakes one, `close()` wakes them all for good). `Signal`
and `Signals` report what the service did, so tests and embedding code wait on an event rather
than poll: a LISTEN (re)connect, a committed batch, a loop that found nothing due.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

__all__ = ["Doorbell", "Signal", "Signals"]


class Doorbell:
    """Wakes the claim loops. `ring()` (a NOTIFY: work came due) wakes one waiting loop, or,
    when none waits, lets the next loop that waits go at once: one wake-up per ring, so two
    idle loops do not both claim for one append. `ring_all()` wakes every loop (anything may
    have come due, e.g. while the LISTEN connection was down); `close()` wakes them for good."""

    def __init__(self) -> None:
        self._waiters: deque[anyio.Event] = deque()
        self._pending = False
        self.closed = False

    def ring(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self._pending = True

    def ring_all(self) -> None:
        self._pending = True
        while self._waiters:
            self._waiters.popleft().set()

    def close(self) -> None:
        self.closed = True
        self.ring_all()

    async def wait(self) -> None:
        if self.closed:
            return
        if self._pending:
            self._pending = False
            return
        rung = anyio.Event()
        self._waiters.append(rung)
        try:
            await rung.wait()
        finally:
            if not rung.is_set():  # cancelled (a timeout): the next ring is someone else's
                self._waiters.remove(rung)


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
