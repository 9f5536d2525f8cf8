"""The worker service's LISTEN connection: wake-ups from appends, never needed for correctness.

`listen()` keeps one connection LISTENing on the install's work channel, reconnecting with
backoff: a NOTIFY names the bucket that got work (the ring learns it) and rings one claim
loop; a (re)connect rings them all, since anything may have come due meanwhile. The poll
interval bounds every wait without it. The connection is its own when the DSN is known (the
CLI), else one held from the worker's pool (an application's `running_worker`), given back
clean. `Listener` is what the service and its metrics see of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from outbox import db
from outbox.obs import log
from outbox.obs.metrics import Metrics
from outbox.queue.settle import group_channel, work_channel
from outbox.retry import describe_error
from outbox.worker.batch import Worker
from outbox.worker.signals import Doorbell, Signals

__all__ = ["Listener", "listen"]

_logger = log.get_logger("outbox.worker")


@dataclass
class Listener:
    """The LISTEN connection's state: where it connects ('': the worker's pool), whether it is
    up, and where that is reported (the `listening` signal, the connected gauge)."""

    dsn: str
    metrics: Metrics
    signals: Signals
    connected: bool = False

    def up(self) -> None:
        self.connected = True
        self.metrics.listener_connected.set(1)
        _logger.info("listener.connected")
        self.signals.listening.fire()

    def down(self) -> None:
        self.connected = False
        self.metrics.listener_connected.set(0)


@asynccontextmanager
async def _connection(listener: Listener, worker: Worker) -> AsyncIterator[db.Connection]:
    """A connection of its own for LISTEN: from the DSN when one is known, else one held from
    the worker's pool."""
    settings = worker.app.settings
    if not listener.dsn:
        session = settings.worker_session("outbox-listener")
        async with db.acquire(worker.pool, session=session) as conn:
            yield conn
        return
    sent, _ = settings.session_settings("outbox-listener")
    conn = await db.connect(listener.dsn, server_settings=sent, codecs=False)
    try:
        yield conn
    finally:
        conn.terminate()


async def listen(
    listener: Listener, doorbell: Doorbell, worker: Worker, backoff: Callable[[int], float]
) -> None:
    """Keep a LISTEN connection, reconnecting after `backoff(attempt)` seconds; any failure of
    it is logged and retried."""
    attempt = 0
    # A worker group's workers (S35) are woken for their group's holds alone.
    group = worker.app.settings.group if worker.app.settings.grouped else None
    channel = work_channel() if group is None else group_channel()
    while True:
        error = "connection closed"
        connected = False
        try:
            async with _connection(listener, worker) as conn:
                connected = True
                lost = anyio.Event()

                def on_lost(_conn: object, lost: anyio.Event = lost) -> None:
                    lost.set()

                def on_work(_c: object, _pid: object, _ch: object, payload: object) -> None:
                    if group is None:
                        worker.ring.wake(str(payload))  # the bucket that got work
                    elif payload != group:
                        return  # another worker group's holds
                    doorbell.ring()  # one loop: one append, one campaign

                conn.add_termination_listener(on_lost)
                await conn.add_listener(channel, on_work)
                try:
                    attempt = 0
                    listener.up()
                    worker.ring.wake("")  # appended while we were away: look again
                    doorbell.ring_all()
                    await _watch(conn, lost, worker.app.settings.poll_interval)
                finally:
                    if not listener.dsn:  # borrowed from the application's pool: back clean
                        await _unlisten(conn, channel, on_work, on_lost)
        except Exception as exc:  # could not connect, lost before LISTEN, or while watching
            error = describe_error(exc)
            if not connected:
                _logger.warning("listener.connect_failed", extra={"error": error})
        finally:
            listener.down()
        attempt += 1
        if connected:
            _logger.warning("listener.lost", extra={"error": error})
        await anyio.sleep(backoff(attempt))


async def _watch(conn: db.Connection, lost: anyio.Event, poll_interval: float) -> None:
    # A dead socket is not always reported at once; a cheap query now and then finds out.
    while True:
        with anyio.move_on_after(max(1.0, poll_interval)):
            await lost.wait()
            return
        try:
            with anyio.fail_after(10):
                await conn.fetchval("SELECT 1")
        except Exception:  # any failure here means the connection is gone
            return


async def _unlisten(
    conn: db.Connection,
    channel: str,
    on_work: Callable[..., None],
    on_lost: Callable[[object], None],
) -> None:
    """Take the listener's callbacks and LISTEN off a borrowed connection before it goes back
    (also at shutdown); one gone or slow to answer is left as it is (the pool discards it)."""
    conn.remove_termination_listener(on_lost)
    with anyio.move_on_after(1, shield=True), contextlib.suppress(Exception):
        await conn.remove_listener(channel, on_work)
