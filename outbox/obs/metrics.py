"""Prometheus metrics of a worker process, on their own registry.

The service counts what its batches did and what its shadow passes saw, marks the LISTEN
connection, and sets the gauges from figures it reads now and then (`worker.gauges`).
`serve()` exposes them over HTTP on `--metrics-port` until `stop()`. No SQL here.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from outbox.model import BatchCounts

__all__ = ["DEDUP_CLAIMS", "REFRESH_INTERVAL", "HeldProjector", "Metrics"]


class HeldProjector(Protocol):
    """One projector's holds as the gauges read them (`outbox.queue.holds.ProjectorHolds`)."""

    @property
    def projector(self) -> str: ...
    @property
    def failed(self) -> int: ...
    @property
    def dead(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def campaigns(self) -> int: ...
    @property
    def held_seconds(self) -> float: ...


REFRESH_INTERVAL = 15.0

# The consumer dedup guard runs in the application's own processes: its counter lives on the
# default registry (which an application already exposes), and every worker registry serves it.
DEDUP_CLAIMS = Counter(
    "outbox_dedup_claims",
    "Consumer dedup claims, by scope and outcome (claimed, duplicate).",
    ["scope", "outcome"],
    registry=REGISTRY,
)


class BatchHistogram(Collector):
    """A histogram observed a batch of values at a time: one lock and one bisect per bucket for
    the batch, where prometheus_client's `Histogram.observe` takes locks per value (a batch of
    100 completed rows was 9% of a worker's Python). Exposed like any histogram."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = [*sorted(float(b) for b in buckets), float("inf")]
        self._cumulative = [0] * len(self._bounds)  # values <= each bound, so far
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        ordered = sorted(values)
        if not ordered:
            return
        counts = [bisect_right(ordered, bound) for bound in self._bounds]
        total = sum(ordered)
        with self._lock:
            self._cumulative = [a + b for a, b in zip(self._cumulative, counts, strict=True)]
            self._sum += total

    def _family(self, *, samples: bool) -> HistogramMetricFamily:
        if not samples:
            return HistogramMetricFamily(self.name, self.documentation)
        with self._lock:
            cumulative, total = list(self._cumulative), self._sum
        labels = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        buckets = list(zip(labels, cumulative, strict=True))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=total
        )

    def describe(self) -> Iterable[Metric]:
        return [self._family(samples=False)]

    def collect(self) -> Iterator[Metric]:
        yield self._family(samples=True)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _server: WSGIServer | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        r = self.registry
        r.register(DEDUP_CLAIMS)
        self.batches = Counter("outbox_batches", "Batches run by this process.", registry=r)
        self.events = Counter(
            "outbox_events", "Work rows handled, by outcome.", ["outcome"], registry=r
        )
        self.batch_size = Histogram(
            "outbox_batch_size",
            "Rows claimed per batch.",
            buckets=(0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 10_000),
            registry=r,
        )
        self.leases = Counter(
            "outbox_leases", "Rows leased to non-transactional projectors (S13).", registry=r
        )
        self.lease_reclaims = Counter(
            "outbox_lease_reclaims",
            "Leased rows taken back after their lease expired (each counts an attempt).",
            registry=r,
        )
        self.lease_fenced = Counter(
            "outbox_lease_fenced",
            "Leases this process lost before ending them: its completion changed nothing.",
            registry=r,
        )
        self.apply = Counter(
            "outbox_apply",
            "Events per projector and outcome: applied, skipped (its guard had applied them), "
            "failed.",
            ["projector", "outcome"],
            registry=r,
        )
        self.apply_duration = Histogram(
            "outbox_apply_duration_seconds",
            "Seconds per projector call (one event, or a batch projector's events).",
            ["projector"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.append_to_apply = BatchHistogram(
            "outbox_append_to_apply_seconds",
            "Seconds from a work row's enqueue to the settle of the batch that applied it, by "
            "the database clock.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
            registry=r,
        )
        self.unsubscribed = Counter(
            "outbox_unsubscribed_events",
            "Events no projector subscribes to, completed unapplied (OUTBOX_UNSUBSCRIBED=skip), "
            "by type.",
            ["event_type"],
            registry=r,
        )
        self.transient_errors = Counter(
            "outbox_transient_errors",
            "Batches rolled back by a transient database error, by SQLSTATE (`connection`: the "
            "connection was lost without one).",
            ["sqlstate"],
            registry=r,
        )
        self.listener_connected = Gauge(
            "outbox_listener_connected", "1 while the LISTEN connection is up.", registry=r
        )
        self.claim_loops = Gauge("outbox_claim_loops", "Claim loops running now.", registry=r)
        self.queue_rows = Gauge("outbox_queue_rows", "Work rows by status.", ["status"], registry=r)
        self.oldest_age = Gauge(
            "outbox_oldest_claimable_age_seconds",
            "Age of the oldest pending or failed row (from enqueued_at).",
            registry=r,
        )
        self.blocked = Gauge(
            "outbox_blocked_campaigns", "Campaigns whose head row is failed or dead.", registry=r
        )
        # A snapshot held elsewhere keeps the queue's dead row versions alive (docs/operations.md).
        self.snapshot_age = Gauge(
            "outbox_oldest_snapshot_seconds",
            "How long the oldest snapshot this database's vacuum must respect has been held "
            "(0: none, or the server does not say).",
            registry=r,
        )
        self.snapshot_xmin_age = Gauge(
            "outbox_oldest_snapshot_xmin_age",
            "Transactions since the oldest snapshot this database's vacuum must respect.",
            registry=r,
        )
        self.rotations = Counter(
            "outbox_queue_rotations",
            "Rotations of the queue's oldest slot by this process, by outcome: rotated, empty, "
            "busy (a lock or another rotation in the way), backlog (too many live rows), failed "
            "(S26).",
            ["outcome"],
            registry=r,
        )
        self.shadow_max_lag = Gauge(
            "outbox_shadow_max_lag_seconds",
            "Longest enqueue-to-first-sighting lag a shadow worker saw.",
            registry=r,
        )
        # Each projector on its own track (S24): what holds one projector alone. One series
        # per projector and state: bounded by the projectors, never by campaigns.
        self.projector_holds = Gauge(
            "outbox_projector_holds",
            "Holds of one projector alone, by state (failed: will retry; dead: an operator's; "
            "waiting: paused, requeued or catching up from the journal).",
            ["projector", "state"],
            registry=r,
        )
        self.projector_held_campaigns = Gauge(
            "outbox_projector_held_campaigns",
            "Campaigns a projector is held on (its other projectors go on).",
            ["projector"],
            registry=r,
        )
        self.projector_held_seconds = Gauge(
            "outbox_projector_held_seconds",
            "How long the projector's oldest hold has held (0: none).",
            ["projector"],
            registry=r,
        )
        self._held_projectors: set[str] = set()
        # Where each ordered projector of the worker stands (S25): one pass over the campaigns'
        # heads per projector and refresh, the cost of `maintenance outbox-report`'s figure.
        self.projector_events_behind = Gauge(
            "outbox_projector_events_behind",
            "Events of its types past an ordered projector's checkpoints, to the journal heads.",
            ["projector"],
            registry=r,
        )
        self.projector_oldest_unapplied = Gauge(
            "outbox_projector_oldest_unapplied_seconds",
            "Age of the oldest event of its types an ordered projector has not applied (0: none).",
            ["projector"],
            registry=r,
        )
        self.projector_catching_up = Gauge(
            "outbox_projector_catching_up_campaigns",
            "Campaigns a projector is catching up on from the journal (its catch-up holds).",
            ["projector"],
            registry=r,
        )
        # Each projector's latest build (S30), as recorded; its rate is rate() of its done.
        self.build_events = Gauge(
            "outbox_build_events",
            "Events a projector's latest build applied (done) of those it set out to (total).",
            ["projector", "of"],
            registry=r,
        )
        self.build_running = Gauge(
            "outbox_build_running",
            "Whether a build of the projector runs now (1), or its latest one ended (0).",
            ["projector"],
            registry=r,
        )

    def register_projectors(self, names: Iterable[str]) -> None:
        """Create every projector's labelled series at 0, so `rate()` and absence alerts work
        before its first event."""
        for name in names:
            for outcome in ("applied", "skipped", "failed"):
                self.apply.labels(name, outcome)
            self.apply_duration.labels(name)
            self._held_projectors.add(name)

    def record_batch(self, counts: BatchCounts) -> None:
        """Count one batch; a claim that found nothing is not a batch."""
        if not counts.claimed:
            return
        self.batches.inc()
        self.batch_size.observe(counts.claimed)
        for outcome in ("applied", "skipped", "failed", "dead", "observed"):
            value = getattr(counts, outcome)
            if value:
                self.events.labels(outcome).inc(value)
        for counter, value in (
            (self.leases, counts.leased),
            (self.lease_reclaims, counts.reclaimed),
            (self.lease_fenced, counts.fenced),
        ):
            if value:
                counter.inc(value)

    def record_apply(
        self,
        tally: Mapping[tuple[str, str], int],
        durations: Sequence[tuple[str, float]],
        ages: Sequence[float],
    ) -> None:
        """Per-projector outcomes and call times, and append-to-apply ages, of a committed
        batch (or lease end)."""
        for (projector, outcome), n in tally.items():
            self.apply.labels(projector, outcome).inc(n)
        for projector, seconds in durations:
            self.apply_duration.labels(projector).observe(seconds)
        self.append_to_apply.observe_many(ages)

    def record_unsubscribed(self, by_type: Mapping[str, int]) -> None:
        """Events a committed batch completed unapplied, per type."""
        for event_type, n in by_type.items():
            self.unsubscribed.labels(event_type).inc(n)

    def set_holds(self, holds: Iterable[HeldProjector]) -> None:
        """Every projector's holds (S24); a projector seen before with none left reads 0."""
        found = {h.projector: h for h in holds}
        for name in sorted(self._held_projectors | set(found)):
            h = found.get(name)
            for state in ("failed", "dead", "waiting"):
                self.projector_holds.labels(name, state).set(getattr(h, state) if h else 0)
            self.projector_held_campaigns.labels(name).set(h.campaigns if h else 0)
            self.projector_held_seconds.labels(name).set(h.held_seconds if h else 0.0)
        self._held_projectors |= set(found)

    def set_progress(
        self,
        behind: Mapping[str, tuple[int, float | None]],
        catching_up: Mapping[str, int],
    ) -> None:
        """Each measured ordered projector's events behind and oldest unapplied event's age,
        and every projector's catch-up campaigns (0 for one seen before with none left)."""
        for name, (events, oldest) in behind.items():
            self.projector_events_behind.labels(name).set(events)
            self.projector_oldest_unapplied.labels(name).set(oldest or 0.0)
        for name in sorted(self._held_projectors | set(catching_up)):
            self.projector_catching_up.labels(name).set(catching_up.get(name, 0))
        self._held_projectors |= set(catching_up)

    def set_builds(self, builds: Mapping[str, tuple[int, int, bool]]) -> None:
        """Each projector's latest build: events done, of total, whether it runs (a killed
        one does not)."""
        for name, (done, total, running) in builds.items():
            self.build_events.labels(name, "done").set(done)
            self.build_events.labels(name, "total").set(total)
            self.build_running.labels(name).set(running)

    def set_queue(
        self,
        rows: Mapping[str, int],
        *,
        oldest_age: float | None,
        blocked: int,
        shadow_max_lag: float | None,
    ) -> None:
        """The queue gauges: rows per status, the oldest claimable head's age, blocked
        campaigns, the shadow worker's longest lag (None: nothing of the kind)."""
        for status, n in rows.items():
            self.queue_rows.labels(status).set(n)
        self.oldest_age.set(oldest_age or 0)
        self.blocked.set(blocked)
        self.shadow_max_lag.set(shadow_max_lag or 0)

    def set_snapshot(self, held_seconds: float | None, xmin_age: int | None) -> None:
        """The oldest snapshot held for this database: seconds held and its age in
        transactions (None: nothing holds one, or the server does not say)."""
        self.snapshot_age.set(held_seconds or 0)
        self.snapshot_xmin_age.set(xmin_age or 0)

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[str, int]:
        """Expose `/metrics` on `addr:port` (404 on any other path) from a daemon thread;
        returns the bound address and port (useful with port 0)."""
        metrics = make_wsgi_app(self.registry)

        def only_metrics(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != "/metrics":
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"not found: the metrics are at /metrics\n"]
            body: Iterable[bytes] = metrics(environ, start_response)
            return body

        server = make_server(addr, port, only_metrics, _ThreadingServer, _QuietHandler)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        self._server = server
        host, bound = server.server_address[:2]
        return str(host), int(bound)

    def stop(self) -> None:
        """Stop serving `/metrics` and release the port (a no-op when not serving)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not log lines."""
