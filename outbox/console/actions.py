"""The console's controls: requeue one dead row, retry one failed row now, preview and requeue
an error group, discard one dead row, pause and resume a projector, promote a version and
retire a superseded one. Each runs the same operation as its `maintenance` command
(`outbox.ops`), audited with the authenticated actor, and states that command so a person can
run it from a shell. No SQL and no HTML here: the operations are `outbox.ops`', the pages the
templates'.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from outbox import db
from outbox.ops.discard import discard_one
from outbox.ops.pause import pause_projector, resume_projector
from outbox.ops.report import MAX_LIMIT
from outbox.ops.requeue import RequeueResult, requeue_dead, requeue_one, retry_one
from outbox.ops.retire import retire_projector
from outbox.ops.versions import promote_version
from outbox.projection.app import Outbox
from outbox.queue.repair import database_time
from outbox.retry import describe_error

__all__ = [
    "Done",
    "GroupPreview",
    "Progress",
    "command_line",
    "discard",
    "pause",
    "preview_group",
    "promote",
    "requeue_group",
    "requeue_row",
    "resume",
    "retire",
    "retry_row",
    "row_commands",
]

# Rows a preview lists at most (the command line's bound too); a group's requeue moves every
# row the preview stands for, in as many rounds of it as the group needs.
GROUP_LIMIT = MAX_LIMIT


@dataclass
class Progress:
    """A long action's progress, as its result page shows it while it runs."""

    moved: int = 0
    finished: bool = False
    error: str | None = None

    def add(self, moved: int) -> None:
        self.moved += moved


@dataclass(frozen=True, slots=True)
class Done:
    """What an action did, in a sentence, and the command that does the same; a long one's
    `job` runs after the answer (its `progress` shows on the result page)."""

    message: str
    command: str
    campaign_id: str | None = None
    progress: Progress | None = None
    job: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class GroupPreview:
    """A dry run of a group requeue: the rows it lists (the oldest `limit`), and the
    database's time when it read them: the requeue moves only rows dead by then."""

    fingerprint: str | None
    as_of: datetime
    result: RequeueResult


def command_line(*words: str | int | None) -> str:
    """`maintenance ...` with every value shell-quoted; None words (absent options) dropped
    together with the option before them."""
    parts: list[str] = ["maintenance"]
    items = list(words)
    for i, word in enumerate(items):
        if word is None:
            continue
        if i + 1 < len(items) and items[i + 1] is None and str(word).startswith("--"):
            continue
        parts.append(shlex.quote(str(word)))
    return " ".join(parts)


async def requeue_row(
    pool: db.Pool, campaign_id: str, seq: int, *, actor: str, reason: str | None
) -> Done:
    await requeue_one(pool, campaign_id, seq, actor=actor, reason=reason)
    return Done(
        f"requeued {campaign_id} seq {seq}",
        command_line(
            "outbox-requeue", "--campaign-id", campaign_id, "--seq", seq, "--reason", reason
        ),
        campaign_id,
    )


async def retry_row(
    pool: db.Pool, campaign_id: str, seq: int, *, actor: str, reason: str | None
) -> Done:
    await retry_one(pool, campaign_id, seq, actor=actor, reason=reason)
    return Done(
        f"retried {campaign_id} seq {seq}: due now, its attempts kept",
        command_line(
            "outbox-retry", "--campaign-id", campaign_id, "--seq", seq, "--reason", reason
        ),
        campaign_id,
    )


async def discard(
    pool: db.Pool, app: Outbox, campaign_id: str, seq: int, *, actor: str, reason: str
) -> Done:
    found = await discard_one(pool, app.registry, campaign_id, seq, reason=reason, actor=actor)
    moved = ", ".join(found.checkpoints_moved) or "none"
    return Done(
        f"discarded {campaign_id} seq {seq} ({found.event_type}); checkpoints moved: {moved}",
        _app_command("outbox-discard", campaign_id, seq, "--reason", reason),
        campaign_id,
    )


def _app_command(verb: str, campaign_id: str, seq: int, *rest: str | int | None) -> str:
    """A command about one row that needs the application (`--app`)."""
    return command_line(
        verb, "--app", "<module:attr>", "--campaign-id", campaign_id, "--seq", seq, *rest
    )


def row_commands(campaign_id: str, seq: int, status: str | None) -> list[str]:
    """What an operator runs from a shell about one event: read it, read its audit, and (dead)
    requeue it, (failed) retry it now, or (queued) apply it now."""
    found = [
        command_line("outbox-report", "--campaign-id", campaign_id, "--payload", "--json"),
        command_line("audit", "--campaign-id", campaign_id, "--json"),
    ]
    if status in ("dead", "failed"):
        verb = "outbox-requeue" if status == "dead" else "outbox-retry"
        found.append(
            command_line(verb, "--campaign-id", campaign_id, "--seq", seq, "--reason", "<why>")
        )
    if status is not None:
        found.append(_app_command("outbox-replay", campaign_id, seq))
    return found


def group_command(fingerprint: str | None, limit: int, *, reason: str | None, dry_run: bool) -> str:
    return command_line(
        "outbox-requeue-dead",
        "--error",
        fingerprint,
        "--limit",
        limit,
        *(("--dry-run",) if dry_run else ("--reason", reason)),
    )


async def preview_group(
    executor: db.Executor, fingerprint: str | None, *, limit: int
) -> GroupPreview:
    """The dead rows a requeue of this group (None: the oldest `limit` dead rows) would move:
    a dry run (the console runs it in its read-only session), as of the database's clock."""
    async with db.acquire(executor) as conn:
        as_of = await database_time(conn)
        result = await requeue_dead(
            conn, limit=limit, fingerprint=fingerprint, dry_run=True, died_by=as_of
        )
    return GroupPreview(fingerprint, as_of, result)


def requeue_group(
    pool: db.Pool,
    fingerprint: str | None,
    *,
    died_by: datetime,
    limit: int,
    actor: str,
    reason: str | None,
) -> Done:
    """The requeue a preview stands for, as a job: with a `fingerprint`, every row of the
    group that was dead at the preview (`died_by`), whatever their number, `GROUP_LIMIT` at a
    time in chunks of their own transactions; without, the oldest `limit` dead by then. Rows
    that died since wait for the next preview."""
    progress = Progress()

    async def job() -> None:
        try:
            while True:
                ask = GROUP_LIMIT if fingerprint else limit
                result = await requeue_dead(
                    pool,
                    limit=ask,
                    fingerprint=fingerprint,
                    actor=actor,
                    reason=reason,
                    died_by=died_by,
                    progress=progress.add,
                )
                if not fingerprint or result.requeued < ask:
                    break
        except Exception as exc:  # shown on the result page; nothing moved is undone
            progress.error = describe_error(exc)
        finally:
            progress.finished = True

    what = f"error group {fingerprint}" if fingerprint else f"the oldest {limit:,} dead rows"
    return Done(
        f"requeueing {what}: the rows dead at {died_by:%Y-%m-%d %H:%M:%S} UTC "
        "(rows that died since wait for the next preview)",
        group_command(fingerprint, limit, reason=reason, dry_run=False),
        progress=progress,
        job=job,
    )


async def pause(
    pool: db.Pool, app: Outbox | None, projector: str, *, actor: str, reason: str | None
) -> Done:
    registry = app.registry if app is not None else None
    result = await pause_projector(pool, projector, reason=reason, actor=actor, registry=registry)
    said = "paused" if result.created else f"already paused by {result.pause.paused_by}"
    return Done(
        f"{projector}: {said}",
        command_line("projector-pause", "--projector", projector, "--reason", reason),
    )


async def resume(
    pool: db.Pool, app: Outbox | None, projector: str, *, actor: str, reason: str | None
) -> Done:
    registry = app.registry if app is not None else None
    result = await resume_projector(pool, projector, reason=reason, actor=actor, registry=registry)
    said = "resumed" if result.resumed else "was not paused"
    return Done(
        f"{projector}: {said}",
        command_line("projector-resume", "--projector", projector, "--reason", reason),
    )


async def promote(
    pool: db.Pool,
    projector: str,
    version: int,
    *,
    actor: str,
    reason: str | None,
    force: bool,
) -> Done:
    result = await promote_version(
        pool, projector, version, reason=reason, force=force, actor=actor
    )
    said = (
        f"version {version} was live already"
        if not result.changed
        else f"version {version} is live"
        + (f" (forced: {result.lag.describe()})" if result.forced else "")
    )
    return Done(
        f"{projector}: {said}",
        command_line(
            "projector-promote", projector, "--version", version,
            *(("--force",) if force else ()), "--reason", reason,
        ),
    )  # fmt: skip


async def retire(
    pool: db.Pool, app: Outbox | None, projector: str, version: int, *, actor: str, reason: str
) -> Done:
    registry = app.registry if app is not None else None
    result = await retire_projector(
        pool, projector, version=version, reason=reason, actor=actor, registry=registry
    )
    dropped = ", its read model dropped" if result.dropped else ""
    return Done(
        f"{result.record.projector}: retired, {result.checkpoints} checkpoint(s) and "
        f"{result.markers} marker(s) forgotten{dropped}",
        command_line("projector-retire", projector, "--version", version, "--reason", reason),
    )
