"""The apply worker: claims due work, applies it with the app's projectors, settles it.

- `batch`: a worker's batches: the bucket, the claim, the transaction (`Worker.run_once`);
- `strategy`: what a batch does with what it claimed, and what it hands on past its commit;
- `apply`: the apply worker's strategy (projectors as one group, failures isolated, settle);
- `shadow`: the shadow worker's strategy (claims and sights, applies nothing);
- `walk`: which claimed rows a batch takes, and what it leaves in the campaign queue;
- `lease`: lease mode, for projectors that cannot share the queue's transaction;
- `ring`: which bucket a worker's next batch claims from;
- `service`: the long-running loops, heartbeat, metrics, shutdown; `steps`: what a loop does
  after a batch; `listener`: the LISTEN connection that wakes the loops;
- `signals`: the doorbell that wakes the loops, and what the service reports;
- `runtime`: the one place a service is built from `Settings` (the CLI, `running_worker`,
  `drain_now`);
- `registration`: the worker registry the report reads; `memory`: the process's allocator;
  `transient`: which failures roll a batch back whole.

It runs the queue's statements (`outbox.queue`) and the projections (`outbox.projection`),
and asks the failure policy (`outbox.retry`) what a failure costs. It never renders output or
parses options (`outbox.cli`), and holds no SQL beside its registry's.
"""
