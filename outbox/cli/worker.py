"""`outbox-worker`: run the apply worker for an app's projectors.

Its options are the worker's settings, one per `FIELDS` entry that has one (the same name as
the variable, `OUTBOX_BATCH_SIZE` -> `--batch-size`), generated from the field specs and read
by each spec's own parser, so an option and its variable accept the same text; then its own
(drains, JSON, waiting for the database, logging).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Annotated, NoReturn

import typer

from outbox.cli.common import (
    CONTEXT_SETTINGS,
    AppOption,
    DsnOption,
    LogFormatOption,
    VersionOption,
    emit_json,
    prepare_app,
    run,
)
from outbox.cli.common import main as run_main
from outbox.config import FIELDS, resolve_worker_mode, shorten
from outbox.errors import UsageError
from outbox.model import BatchCounts
from outbox.obs import log
from outbox.ops.report import Leftovers, leftovers
from outbox.projection.sql_projectors import check_functions
from outbox.queries import using_schema
from outbox.worker.memory import pin_malloc_thresholds
from outbox.worker.registration import new_worker_id
from outbox.worker.runtime import build_service, open_pool_when_up
from outbox.worker.service import serve

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
    # Shadow sightings, lease-mode figures (S13) and events left in projectors' holds (S24)
    # only where there are any.
    for name in ("observed", "leased", "reclaimed", "fenced", "held"):
        if value := getattr(counts, name):
            text += f" {name}={value}"
    return text


# The settings that are `outbox-worker` options (the DSN is every command's own option).
SETTING_OPTIONS = tuple(name for name, spec in FIELDS.items() if spec.cli and name != "dsn")


def _with_setting_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` (which takes the settings as `**settings`) with one option per setting in
    `SETTING_OPTIONS`, after its own: no envvar of their own (the settings read the
    environment; a given option overrides it), help from the spec's doc."""
    own = [
        p
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    added = []
    for name in SETTING_OPTIONS:
        spec = FIELDS[name]
        option = typer.Option(
            spec.option, help=f"{spec.doc} ({spec.env}).", metavar=spec.metavar, show_default=False
        )
        annotation = Annotated[str | None, option]
        added.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    command.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
    return command


@dataclass(frozen=True, slots=True)
class DrainSummary:
    """`outbox-worker --drain[-now] --json`: how far it drained, what it did, what is left."""

    until: str
    counts: BatchCounts
    left: Leftovers


@app.command()
@_with_setting_options
def worker(
    app_path: AppOption = None,
    projectors_path: Annotated[
        str | None,
        typer.Option(
            "--projectors",
            envvar="OUTBOX_PROJECTORS",
            help="A projectors file (TOML): SQL projectors, no Python app (instead of --app).",
        ),
    ] = None,
    dsn: DsnOption = None,
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
    wait_for_database: Annotated[
        float | None,
        typer.Option(
            "--wait-for-database",
            envvar="OUTBOX_WAIT_FOR_DATABASE",
            min=0,
            help="Seconds to wait at start for a database that refuses, is starting up or has "
            "no free connection (default: a serving worker waits as long as it takes, a drain "
            "not at all; 0: fail at once).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(envvar="OUTBOX_LOG_LEVEL")] = "info",
    log_format: LogFormatOption = "json",
    version: VersionOption = False,
    **settings: str | None,
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
    given = {name: FIELDS[name].read(raw) for name, raw in settings.items() if raw is not None}
    if projectors_path is not None:
        if app_path is not None:
            raise UsageError("--projectors and --app exclude each other: give one")
        if not projectors_path.endswith(".toml"):
            raise UsageError(f"--projectors: expected a .toml file, got {shorten(projectors_path)}")
        app_path = projectors_path
    outbox_app = prepare_app(app_path, dsn=dsn, **given)
    pin_malloc_thresholds()  # a process of its own: its heap must not creep over the days
    resolved = outbox_app.settings
    resolution = resolve_worker_mode(resolved)
    logger = log.get_logger("outbox.worker")
    if resolution.warning:
        logger.warning("worker.mode_conflict", extra={"warning": resolution.warning})

    wait = wait_for_database if wait_for_database is not None or not drain_only else 0.0

    async def body() -> tuple[BatchCounts, Leftovers | None]:
        pool = await open_pool_when_up(resolved, wait=wait)
        try:
            with using_schema(resolved.schema):
                await check_functions(pool, outbox_app.registry.sql_signatures())
            service = build_service(
                outbox_app,
                pool,
                mode=resolution.mode,
                worker_id=worker_id,
                until_idle=drain_only,
                wait_out_backoff=drain_all,
                own_pool=True,
            )
            logger.info(
                "worker.started",
                extra={
                    "concurrency": resolved.concurrency,
                    "max_concurrency": service.loops.ceiling,
                    "mode": resolution.mode,
                },
            )
            counts = await serve(service)
            left = await leftovers(pool, park=resolved.park) if drain_only else None
            return counts, left
        finally:
            await pool.close()

    counts, left = run(body)
    if left is None:
        logger.info("worker.stopped", extra=vars(counts))
    elif as_json:
        until = "done" if drain_all else "nothing due now"
        emit_json("drain", DrainSummary(until, counts, left))
    else:
        typer.echo(f"drained: {_summary(counts)}")
        if drain_all and any(dataclasses.asdict(left).values()):
            typer.echo(f"left: {_leftovers(left)}")


def _leftovers(left: Leftovers) -> str:
    """What a finished drain left and why, on one line."""
    shown = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(left).items() if v)
    why = []
    if left.dead:
        why.append("dead rows wait for an operator (fix, then maintenance outbox-requeue-dead)")
    if left.blocked_campaigns and (left.pending or left.failed):
        why.append("the others wait behind their campaign's dead head")
    if left.processing:
        why.append("processing rows are leased by a worker that stopped; they come due later")
    return f"{shown} ({'; '.join(why)})" if why else shown


def _stopped_before_serving(signum: int, _frame: FrameType | None) -> None:
    # Until the service installs its own handler nothing is claimed: stop at once, cleanly. By
    # os._exit: an exception raised while an import runs a weakref callback (the app's module,
    # its stack) is printed as "ignored" and dropped, and the worker would go on to serve.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def main(argv: list[str] | None = None, prog: str = "outbox-worker") -> NoReturn:
    signal.signal(signal.SIGTERM, _stopped_before_serving)
    run_main(app, prog, argv)
