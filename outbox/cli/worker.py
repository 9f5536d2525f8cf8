"""`outbox-worker`: run the apply worker for an app's projectors."""

from __future__ import annotations

import enum
import signal
from types import FrameType
from typing import Annotated, NoReturn

import typer

from outbox import log
from outbox.cli.common import (
    CONTEXT_SETTINGS,
    AppOption,
    DsnOption,
    UsageError,
    VersionOption,
    prepare_app,
    require_dsn,
    run,
)
from outbox.cli.common import main as run_main
from outbox.config import resolve_worker_mode
from outbox.errors import ConfigError
from outbox.migrate import check_current
from outbox.service import Service, open_pool, serve
from outbox.worker import BatchCounts, ShadowWorker, Worker

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


class Mode(enum.StrEnum):
    apply = "apply"
    shadow = "shadow"


@app.command()
def worker(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    mode: Annotated[
        Mode | None,
        typer.Option("--mode", help="apply or shadow; overrides the OUTBOX_*_ENABLED flags."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Claim loops.")] = 1,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Rows per batch (OUTBOX_BATCH_SIZE).")
    ] = None,
    drain_only: Annotated[
        bool, typer.Option("--drain", help="Exit 0 once no row is due, with a summary line.")
    ] = False,
    shutdown_timeout: Annotated[
        float, typer.Option(min=0.0, max=3600.0, help="Seconds to finish the batch on SIGTERM.")
    ] = 30.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="OUTBOX_METRICS_PORT", min=0, max=65535, help="Serve Prometheus /metrics here."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(envvar="OUTBOX_LOG_LEVEL")] = "info",
    version: VersionOption = False,
) -> None:
    """Run the worker until SIGTERM/SIGINT (or, with --drain, until nothing is due)."""
    try:
        log.configure(log_level)
    except ValueError as exc:
        raise UsageError(f"--log-level: {exc}") from None
    outbox_app = prepare_app(app_path, dsn=dsn, batch_size=batch_size)
    try:
        resolution = resolve_worker_mode(outbox_app.settings, mode.value if mode else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    logger = log.get_logger("outbox.worker")
    if resolution.warning:
        logger.warning("worker.mode_conflict", extra={"warning": resolution.warning})
    target = require_dsn(outbox_app.settings)

    async def body() -> BatchCounts:
        pool = await open_pool(outbox_app.settings, max_size=concurrency + 1)
        try:
            await check_current(pool)
            kind = ShadowWorker if resolution.mode == "shadow" else Worker
            service = Service(
                kind(outbox_app, pool),
                target,
                concurrency,
                mode=resolution.mode,
                metrics_port=metrics_port,
                until_idle=drain_only,
            )
            logger.info(
                "worker.started", extra={"concurrency": concurrency, "mode": resolution.mode}
            )
            return await serve(service, shutdown_timeout=shutdown_timeout)
        finally:
            await pool.close()

    counts = run(body)
    if drain_only:
        typer.echo(f"drained: {_summary(counts)}")
    else:
        log.get_logger("outbox.worker").info("worker.stopped", extra=vars(counts))


def _stopped_before_serving(signum: int, _frame: FrameType | None) -> None:
    # Until the service installs its own handler nothing is claimed: stop at once, cleanly.
    raise SystemExit(0)


def main(argv: list[str] | None = None, prog: str = "outbox-worker") -> NoReturn:
    signal.signal(signal.SIGTERM, _stopped_before_serving)
    run_main(app, prog, argv)
