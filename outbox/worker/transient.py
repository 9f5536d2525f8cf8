"""What a batch's failure means for the batch: a transient database failure (a lost connection,
a deadlock, a timeout), found anywhere in the chain of errors or inside a projector's task
group, fails the batch, never the event: the transaction rolls back whole and no attempt is
consumed."""

from __future__ import annotations

from outbox import db
from outbox.errors import TransientBatchError
from outbox.projection.dispatch import GroupFailed
from outbox.retry import ErrorClass, classify, describe_error, leaves

__all__ = ["raise_transient", "transient_cause"]


def transient_cause(exc: BaseException) -> TransientBatchError | None:
    """The transient failure behind `exc`: a dead connection often surfaces as a second error
    (e.g. the transaction's exit on a closed connection) raised while handling the first."""
    found: TransientBatchError | None = None
    lost = False
    seen: BaseException | None = exc
    while seen is not None:  # report the root: the deepest transient error in the chain
        if isinstance(seen, TransientBatchError):
            found = seen
            lost = lost or seen.connection_lost
        elif classify(seen) is ErrorClass.TRANSIENT:
            found = TransientBatchError(describe_error(seen), sqlstate=db.sqlstate_of(seen))
            lost = lost or db.connection_lost(seen)
        seen = seen.__cause__ or seen.__context__
    if found is not None and lost:
        found.connection_lost = True
    return found


def raise_transient(failed: GroupFailed, *, closed: bool) -> None:
    """A transient cause (also one inside a projector's task group) or a connection that died
    under the projector is the batch's failure, not the event's: raised as
    TransientBatchError."""
    causes = leaves(failed.cause)
    if closed or any(classify(c) is ErrorClass.TRANSIENT for c in causes):
        lost = closed or any(db.connection_lost(c) for c in causes)
        raise TransientBatchError(
            describe_error(failed.cause), connection_lost=lost
        ) from failed.cause
