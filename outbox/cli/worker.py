"""`outbox-worker`: run the apply worker for an app's projectors."""

from __future__ import annotations

import enum
import signal
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer

from outbox import log, maintenance
from outbox.cli.common import (
    CONTEXT_SETTINGS,
    AppOption,
    DsnOption,
    LogFormatOption,
    UsageError,
    VersionOption,
    emit_json,
    prepare_app,
    require_dsn,
    run,
)
from outbox.cli.common import main as run_main
from outbox.config import FIELDS, resolve_worker_mode
from outbox.errors import ConfigError
from outbox.migrate import check_current
from outbox.service import Service, open_pool, serve
from outbox.worker import BatchCounts, ShadowWorker, Worker
from outbox.workers import new_worker_id

app = typer.Typer(
    name="outbox-worker",
    help="Claim due work rows and apply the app's projectors exactly once.",
    context_settings=CONTEXT_SETTINGS,
    pretty_exceptions_enable=False,
)


def _summary(counts: BatchCounts) -> str:
    text = (
        f"applied={counts.applied} skipped={counts.skipped} "
        f"failed={counts.failed} dead={counts.dead}"
    )
    # Shadow sightings and lease-mode figures (S13) only where there are any.
    for name in ("observed", "leased", "reclaimed", "fenced"):
        if value := getattr(counts, name):
            text += f" {name}={value}"
    return text


def _setting(name: str) -> Any:
    """The option of a setting (FIELDS): same name as its variable, no envvar of its own (the
    settings read the environment; a given option overrides it), help from its doc."""
    spec = FIELDS[name]
    return typer.Option(spec.option, help=f"{spec.doc} ({spec.env}).", show_default=False)


class Mode(enum.StrEnum):
    apply = "apply"
    shadow = "shadow"


@app.command()
def worker(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    mode: Annotated[
        Mode | None,
        typer.Option(
            "--mode",
            envvar="OUTBOX_MODE",
            help="apply or shadow; overrides the OUTBOX_*_ENABLED flags.",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(envvar="OUTBOX_CONCURRENCY", min=1, max=256, help="Claim loops.")
    ] = 1,
    batch_size: Annotated[int | None, _setting("batch_size")] = None,
    poll_interval: Annotated[float | None, _setting("poll_interval")] = None,
    backoff_base: Annotated[float | None, _setting("backoff_base")] = None,
    backoff_cap: Annotated[float | None, _setting("backoff_cap")] = None,
    max_attempts: Annotated[int | None, _setting("max_attempts")] = None,
    ordering: Annotated[str | None, _setting("ordering")] = None,
    dead_policy: Annotated[str | None, _setting("dead_policy")] = None,
    lease_seconds: Annotated[float | None, _setting("lease_seconds")] = None,
    statement_timeout: Annotated[float | None, _setting("statement_timeout")] = None,
    lock_timeout: Annotated[float | None, _setting("lock_timeout")] = None,
    idle_in_transaction_timeout: Annotated[
        float | None, _setting("idle_in_transaction_timeout")
    ] = None,
    drain_all: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Exit 0 once nothing outstanding can come due (waiting out backoffs), "
            "saying what is left: dead rows and the campaigns they block.",
        ),
    ] = False,
    drain_now: Annotated[
        bool, typer.Option("--drain-now", help="Exit 0 once no row is due now.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With a drain: the summary as one JSON object.")
    ] = False,
    shutdown_timeout: Annotated[
        float,
        typer.Option(
            envvar="OUTBOX_SHUTDOWN_TIMEOUT",
            min=0.0,
            max=3600.0,
            help="Seconds to finish the batch on SIGTERM.",
        ),
    ] = 30.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="OUTBOX_METRICS_PORT", min=0, max=65535, help="Serve Prometheus /metrics here."
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            envvar="OUTBOX_METRICS_HOST",
            help="The address /metrics binds to (0.0.0.0: every interface).",
        ),
    ] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(envvar="OUTBOX_LOG_LEVEL")] = "info",
    log_format: LogFormatOption = "json",
    version: VersionOption = False,
) -> None:
    """Run the worker until SIGTERM/SIGINT (or, with --drain, until the work is done)."""
    if drain_all and drain_now:
        raise UsageError("--drain and --drain-now exclude each other")
    drain_only = drain_all or drain_now
    if as_json and not drain_only:
        raise UsageError("--json needs --drain or --drain-now (a serving worker logs JSON)")
    worker_id = new_worker_id()  # on every line this process logs, and its leases' owner
    try:
        log.configure(log_level, fmt=log_format, fields={"worker_id": worker_id})
    except ValueError as exc:
        raise UsageError(f"--log-level/--log-format: {exc}") from None
    outbox_app = prepare_app(
        app_path,
        dsn=dsn,
        batch_size=batch_size,
        poll_interval=poll_interval,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        max_attempts=max_attempts,
        ordering=ordering.strip().lower() if ordering else None,
        dead_policy=dead_policy.strip().lower() if dead_policy else None,
        lease_seconds=lease_seconds,
        statement_timeout=statement_timeout,
        lock_timeout=lock_timeout,
        idle_in_transaction_timeout=idle_in_transaction_timeout,
    )
    try:
        resolution = resolve_worker_mode(outbox_app.settings, mode.value if mode else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    logger = log.get_logger("outbox.worker")
    if resolution.warning:
        logger.warning("worker.mode_conflict", extra={"warning": resolution.warning})
    target = require_dsn(outbox_app.settings)

    park = outbox_app.settings.dead_policy == "park"

    async def body() -> tuple[BatchCounts, dict[str, int]]:
        pool = await open_pool(outbox_app.settings, max_size=concurrency + 1)
        try:
            await check_current(pool)
            kind = ShadowWorker if resolution.mode == "shadow" else Worker
            service = Service(
                kind(outbox_app, pool, worker_id=worker_id),
                target,
                concurrency,
                mode=resolution.mode,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
                until_idle=drain_only,
                wait_out_backoff=drain_all,
            )
            logger.info(
                "worker.started", extra={"concurrency": concurrency, "mode": resolution.mode}
            )
            counts = await serve(service, shutdown_timeout=shutdown_timeout)
            left = await maintenance.leftovers(pool, park=park) if drain_only else {}
            return counts, left
        finally:
            await pool.close()

    counts, left = run(body)
    if not drain_only:
        log.get_logger("outbox.worker").info("worker.stopped", extra=vars(counts))
    elif as_json:
        emit_json(
            "drain",
            {
                "until": "done" if drain_all else "nothing due now",
                "counts": vars(counts),
                "left": left,
            },
        )
    else:
        typer.echo(f"drained: {_summary(counts)}")
        if drain_all and any(left.values()):
            typer.echo(f"left: {_leftovers(left)}")


def _leftovers(left: dict[str, int]) -> str:
    """What a finished drain left and why, on one line."""
    shown = " ".join(f"{k}={v}" for k, v in left.items() if v)
    why = []
    if left["dead"]:
        why.append("dead rows wait for an operator (fix, then maintenance outbox-requeue-dead)")
    if left["blocked_campaigns"] and (left["pending"] or left["failed"]):
        why.append("the others wait behind their campaign's dead head")
    if left["processing"]:
        why.append("processing rows are leased by a worker that stopped; they come due later")
    return f"{shown} ({'; '.join(why)})" if why else shown


def _stopped_before_serving(signum: int, _frame: FrameType | None) -> None:
    # Until the service installs its own handler nothing is claimed: stop at once, cleanly.
    raise SystemExit(0)


def main(argv: list[str] | None = None, prog: str = "outbox-worker") -> NoReturn:
    signal.signal(signal.SIGTERM, _stopped_before_serving)
    run_main(app, prog, argv)
