"""`maintenance projector-pause`, `projector-resume` and `projector-pauses`: an operator's hold
on one projector while it (or what it writes to) is being fixed; `projectors`, the projectors
the database knows and their versions' states; `projector-promote`, making a version live;
`projector-redefine`, recording a change of a definition that is safe in place; and
`projector-retire`, taking one out of them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from outbox.cli.common import AppOption, DsnOption, JsonOption, emit_json, prepare_app, stdout
from outbox.cli.operator import ReasonOption, app, pool_run, when
from outbox.errors import UsageError
from outbox.ops.pause import list_paused, pause_projector, resume_projector
from outbox.ops.redefine import check_redefinition, redefine_projector
from outbox.ops.retire import check_retirement, list_projectors, retire_projector
from outbox.ops.versions import check_version, promote_version
from outbox.projection.registry import Registry

ProjectorOption = Annotated[str, typer.Option("--projector", help="The projector's name.")]
# `projector-promote roster --version 2`, `projector-retire roster --version 1` (or --projector).
NameArgument = Annotated[
    str | None,
    typer.Argument(help="The projector's name (or --projector).", show_default=False),
]
NamedOption = Annotated[
    str | None,
    typer.Option("--projector", help="The projector's name.", show_default=False),
]
VersionOption = Annotated[
    int | None,
    typer.Option(
        "--version", min=1, help="Which version of it (S29; default: 1).", show_default=False
    ),
]


def _name(argument: str | None, option: str | None) -> str:
    """The projector named once, as the argument or as --projector."""
    if (argument is None) == (option is None):
        raise UsageError("name the projector once: as the argument or with --projector")
    name = argument if argument is not None else option
    assert name is not None
    return name


def _registry(app_path: str | None, dsn: str | None) -> Registry | None:
    """The app's projectors when --app (or OUTBOX_APP) is given: the name is checked."""
    return prepare_app(app_path, dsn=dsn).registry if app_path else None


@app.command("projector-pause")
def projector_pause_command(
    projector: ProjectorOption,
    dsn: DsnOption = None,
    reason: ReasonOption = None,
    app_path: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pause one projector: the events it subscribes to wait (their campaigns too, under
    campaign ordering), no attempt consumed; every worker honours it within a poll interval."""
    registry = _registry(app_path, dsn)
    result = pool_run(
        dsn, lambda pool: pause_projector(pool, projector, reason=reason, registry=registry)
    )
    if as_json:
        emit_json("projector-pause", result)
    elif result.created:
        stdout.print(f"paused {projector}")
    else:
        p = result.pause
        stdout.print(f"{projector} was already paused by {p.paused_by} at {when(p.paused_at)}")


@app.command("projector-resume")
def projector_resume_command(
    projector: ProjectorOption,
    dsn: DsnOption = None,
    reason: ReasonOption = None,
    app_path: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a paused projector: its waiting events apply within about two poll intervals."""
    registry = _registry(app_path, dsn)
    result = pool_run(
        dsn, lambda pool: resume_projector(pool, projector, reason=reason, registry=registry)
    )
    if as_json:
        emit_json("projector-resume", result)
    else:
        stdout.print(f"resumed {projector}" if result.resumed else f"{projector} was not paused")


@app.command("projector-pauses")
def projector_pauses_command(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """The projectors paused now (who paused each, when, why) and the latest pauses and
    resumes."""
    result = pool_run(dsn, list_paused)
    if as_json:
        emit_json("projector-pauses", result)
        return
    table = Table("projector", "paused at", "by", "reason", title="paused projectors")
    for p in result.pauses:
        table.add_row(p.projector, when(p.paused_at), p.paused_by, p.reason or "")
    stdout.print(table)
    history = Table("at", "projector", "action", "by", "reason", title="latest pauses and resumes")
    for e in result.history:
        history.add_row(when(e.at), e.projector, e.action, e.actor, e.reason or "")
    stdout.print(history)


@app.command("projectors")
def projectors_command(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """The projectors the database knows: recorded by the workers that run them (their types,
    ordered or not, the worker group that serves them (S35), the fingerprint of their
    definition, when first and last seen, by which worker), until retired; each version with
    its state (live, building, superseded)."""
    found = pool_run(dsn, list_projectors)
    if as_json:
        emit_json("projectors", {"projectors": found})
        return
    table = Table(
        "projector",
        "version",
        "state",
        "events",
        "ordered",
        "transactional",
        "start",
        "group",
        "fingerprint",
        "first seen",
        "last seen",
        "by",
        "paused",
        title="projectors",
    )
    for p in found:
        table.add_row(
            p.base,
            str(p.version),
            p.state,
            ", ".join(p.events),
            "yes" if p.ordered else "no",
            "yes" if p.transactional else "no (lease)",
            p.start,
            p.group,
            p.fingerprint or "-",
            when(p.first_seen_at),
            when(p.last_seen_at),
            p.last_seen_by,
            "paused" if p.paused else "",
        )
    stdout.print(table)


@app.command("projector-promote")
def projector_promote_command(
    name: NameArgument = None,
    version: Annotated[
        int | None,
        typer.Option("--version", min=1, help="The version to make live.", show_default=False),
    ] = None,
    projector: NamedOption = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Promote it even though it is not caught up."),
    ] = False,
    dsn: DsnOption = None,
    reason: ReasonOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a version of a projector the live one, in one step (S29): readers asking
    `outbox_live_version` read it from the commit on, and the versions below it are owed no
    more work. Refused while it is not caught up (the error says what it lacks), unless
    --force."""
    chosen = _name(name, projector)
    if version is None:
        raise UsageError("--version is required: the version to make live")
    check_version(chosen, version)
    result = pool_run(
        dsn,
        lambda pool: promote_version(pool, chosen, version, reason=reason, force=force),
    )
    if as_json:
        emit_json("projector-promote", result)
    elif not result.changed:
        stdout.print(f"version {version} of {chosen} was live already")
    else:
        forced = f" (forced: {result.lag.describe()})" if result.forced else ""
        stdout.print(f"version {version} of {chosen} is live{forced}")
        if result.previous is not None:
            stdout.print(
                f"version {result.previous} is owed no more work "
                f"({result.released} hold(s) of superseded versions released)"
            )


@app.command("projector-retire")
def projector_retire_command(
    reason: Annotated[str, typer.Option("--reason", help="Why it is retired, for the audit.")],
    name: NameArgument = None,
    projector: NamedOption = None,
    version: VersionOption = None,
    drop_guards: Annotated[
        bool,
        typer.Option(
            "--drop-guards",
            help="Also delete its checkpoints and processed markers (needs --yes).",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm --drop-guards.")] = False,
    dsn: DsnOption = None,
    app_path: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retire a projector gone from the code of every worker: the database stops counting it
    (audited, a pause of it lifted); with --drop-guards --yes its checkpoints and markers go
    too. Its read model is yours to drop. A superseded version (--version) is retired whenever
    you like: its checkpoints and markers go, and with --app its drop hook drops its read
    model."""
    chosen = _name(name, projector)
    if drop_guards and not yes:
        raise UsageError(
            f"--drop-guards deletes {chosen!r}'s checkpoints and markers for good: "
            "pass --yes to do it"
        )
    check_retirement(chosen, reason, version)  # before any connection
    registry = _registry(app_path, dsn)
    result = pool_run(
        dsn,
        lambda pool: retire_projector(
            pool,
            chosen,
            reason=reason,
            drop_guards=drop_guards,
            registry=registry,
            version=version,
        ),
    )
    if as_json:
        emit_json("projector-retire", result)
        return
    stdout.print(f"retired {result.record.projector}")
    if result.checkpoints or result.markers or drop_guards:
        stdout.print(f"dropped {result.checkpoints} checkpoint(s) and {result.markers} marker(s)")
    if result.dropped:
        stdout.print("its drop hook dropped its read model")


@app.command("projector-redefine")
def projector_redefine_command(
    reason: Annotated[str, typer.Option("--reason", help="Why it is redefined, for the audit.")],
    name: NameArgument = None,
    projector: NamedOption = None,
    version: VersionOption = None,
    dsn: DsnOption = None,
    app_path: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record the app's definition of a projector in place of the recorded one, audited (S33):
    only a change safe in place (where it starts, its kind among per event, batch and SQL, a
    SQL projector's function); any other change is refused: ship it as a new version. Workers
    still running the old definition stop running the projector within a poll interval."""
    chosen = _name(name, projector)
    check_redefinition(chosen, reason, version)  # before any connection
    registry = _registry(app_path, dsn)
    if registry is None:
        raise UsageError("--app is required: the app whose definition is recorded")
    result = pool_run(
        dsn,
        lambda pool: redefine_projector(
            pool, chosen, registry=registry, reason=reason, version=version
        ),
    )
    if as_json:
        emit_json("projector-redefine", result)
        return
    shown = "; ".join(result.changes) or "no change"
    stdout.print(f"recorded {result.projector}'s definition ({shown}): {result.fingerprint}")
