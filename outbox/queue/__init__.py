"""The work queue's store: every statement on the work rows (`projection_apply_outbox`), the
campaign queue that indexes them (`projection_apply_campaigns`) and the requeue audit.

- `claim`: what a batch takes, with its events, and the locks that hold a campaign;
- `settle`: the end of a batch in one statement, and the campaign queue kept in line;
- `lease`: lease mode's statements (lease, extend, complete, fail, release);
- `repair`: requeues of dead rows (audited) and work rows for unqueued journal events;
- `inspect`: reads for the report, health, metrics, drains and read-your-writes.

One exception, for one round trip per append: the append's own statement inserts an event's
work row (`outbox.append.journal`). This package decides no policy (which rows a batch walks,
what delay, when a row is dead, what a campaign row becomes: the worker's and the failure
policy's) and never runs a projector. Every statement runs on the caller's executor, inside
the caller's transaction when there is one.
"""
