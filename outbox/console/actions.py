"""The console's controls: requeue one dead row, preview and requeue an error group, discard one
dead row, pause and resume a projector. Each runs the same operation as its `maintenance`
command (`outbox.ops`), audited with the authenticated actor, and states that command so a
person can run it from a shell. No SQL and no HTML here: the operations are `outbox.ops`', the
pages the templates'.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from outbox import db
from outbox.ops.discard import discard_one
from outbox.ops.pause import pause_projector, resume_projector
from outbox.ops.requeue import RequeueResult, requeue_dead, requeue_one
from outbox.projection.app import Outbox

__all__ = [
    "Done",
    "command_line",
    "discard",
    "pause",
    "preview_group",
    "requeue_group",
    "requeue_row",
    "resume",
    "row_commands",
]

# Rows one group requeue moves at most (the preview lists them all).
GROUP_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Done:
    """What an action did, in a sentence, and the command that does the same."""

    message: str
    command: str
    campaign_id: str | None = None


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


async def discard(
    pool: db.Pool, app: Outbox, campaign_id: str, seq: int, *, actor: str, reason: str
) -> Done:
    found = await discard_one(pool, app.registry, campaign_id, seq, reason=reason, actor=actor)
    moved = ", ".join(found.checkpoints_moved) or "none"
    return Done(
        f"discarded {campaign_id} seq {seq} ({found.event_type}); checkpoints moved: {moved}",
        command_line(
            "outbox-discard",
            "--app",
            "<module:attr>",
            "--campaign-id",
            campaign_id,
            "--seq",
            seq,
            "--reason",
            reason,
        ),
        campaign_id,
    )


def row_commands(campaign_id: str, seq: int, status: str | None) -> list[str]:
    """What an operator runs from a shell about one event: read it, read its audit, and (dead)
    requeue it or (queued) apply it now."""
    found = [
        command_line("outbox-report", "--campaign-id", campaign_id, "--payload", "--json"),
        command_line("audit", "--campaign-id", campaign_id, "--json"),
    ]
    if status == "dead":
        found.append(
            command_line(
                "outbox-requeue", "--campaign-id", campaign_id, "--seq", seq, "--reason", "<why>"
            )
        )
    if status is not None:
        found.append(
            command_line(
                "outbox-replay",
                "--app",
                "<module:attr>",
                "--campaign-id",
                campaign_id,
                "--seq",
                seq,
            )
        )
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
) -> RequeueResult:
    """Exactly the dead rows a requeue of this group (None: the oldest `limit` of all dead
    rows) would move now: a dry run (the console runs it in its read-only session)."""
    return await requeue_dead(executor, limit=limit, fingerprint=fingerprint, dry_run=True)


async def requeue_group(
    pool: db.Pool, fingerprint: str | None, *, limit: int, actor: str, reason: str | None
) -> Done:
    result = await requeue_dead(
        pool, limit=limit, fingerprint=fingerprint, actor=actor, reason=reason
    )
    return Done(
        f"requeued {result.requeued} row(s)"
        + (f" of error group {fingerprint}" if fingerprint else ", the oldest dead"),
        group_command(fingerprint, limit, reason=reason, dry_run=False),
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
