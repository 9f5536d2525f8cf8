"""The apply worker: claims due work, applies it with the app's projectors, settles it.

- `batch`: one batch in one transaction (`Worker.run_once`);
- `shadow`: the shadow worker (claims and sights, applies nothing);
- `walk`: which claimed rows a batch takes, and what it leaves in the campaign queue;
- `lease`: lease mode, for projectors that cannot share the queue's transaction;
- `service`: the long-running loops, LISTEN wake-ups, heartbeat, metrics, shutdown;
- `signals`: the doorbell that wakes the loops, and what the service reports;
- `runtime`: the one place a service is built from `Settings` (the CLI, `running_worker`,
  `drain_now`);
- `registration`: the worker registry the report reads.

It runs the queue's statements (`outbox.queue`) and the projections (`outbox.projection`),
and asks the failure policy (`outbox.retry`) what a failure costs. It never renders output or
parses options (`outbox.cli`), and holds no SQL beside its registry's.
"""
