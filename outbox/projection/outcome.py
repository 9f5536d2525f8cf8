"""What a dispatch makes of a group: each event's outcome, or the failure that stopped it.

Kept apart from `outbox.projection.dispatch`, which raises and returns them, so that callers
(the worker's strategies, inline apply, replay) name them without the dispatch's machinery.
"""

from __future__ import annotations

import enum

from outbox.model import Key
from outbox.obs import log
from outbox.retry import describe_error

__all__ = ["ApplyOutcome", "GroupFailed", "announce_unsubscribed"]

_logger = log.get_logger("outbox.worker")
# Event types this process completed unsubscribed and said so (once per type).
_announced: set[str] = set()


def announce_unsubscribed(event_type: str) -> None:
    """Log, once per type per process, that `event_type`'s events complete unapplied (S8)."""
    if event_type not in _announced:
        _announced.add(event_type)
        hint = "no projector subscribes: its events complete unapplied (OUTBOX_UNSUBSCRIBED="
        hint += "skip); a projector added later rebuilds from the journal"
        _logger.info("apply.unsubscribed", extra={"event_type": event_type, "hint": hint})


class ApplyOutcome(enum.Enum):
    APPLIED = "applied"  # at least one projector ran
    DUPLICATE = "duplicate"  # every subscribed projector had already applied it
    IGNORED = "ignored"  # the app declared the type as needing no projection
    UNSUBSCRIBED = "unsubscribed"  # no projector subscribes, and OUTBOX_UNSUBSCRIBED=skip
    HELD = "held"  # no projector ran it: the ones that owe it are held (S24), it waits in
    # their holds
    BEHIND = "behind"  # an ordered projector is still catching its campaign up: not applied


class GroupFailed(Exception):
    """A group of events failed; `index` is the failing event's position when known, and
    `projector` the name of the projector that raised (None: a guard or the dispatch), `event`
    the (campaign_id, seq) it raised on when known (a journal event too), and its type."""

    def __init__(
        self,
        cause: BaseException,
        index: int | None,
        projector: str | None = None,
        event: Key | None = None,
        event_type: str | None = None,
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.index = index
        self.projector = projector
        self.event = event
        self.event_type = event_type

    def describe(self) -> str:
        """The `last_error` line: the projector's name, the error's type and message."""
        return describe_error(self.cause, projector=self.projector)
