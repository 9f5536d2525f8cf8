"""The soak's worker app (`outbox-worker --app _soak_app:app`, run from bench/).

One per-event projector, `tally`, unguarded (no checkpoint, no marker): exactly-once rests on
the queue's transaction alone. It keeps one row per campaign whatever the run's length: how
many events were applied, the highest generator index `i` seen, and how many arrived at or
below it (applied twice) or past the next one (out of order). The soak compares them with the
counts its own generator recorded.

With SOAK_TRACEMALLOC set to a directory, the process traces allocations and writes a
snapshot there every SOAK_TRACEMALLOC_EVERY seconds (default 120): what the soak reads when a
worker's memory keeps rising.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

from outbox import Outbox, StoredEvent, db

EVENT_TYPE = "soak.step"
SCHEMA = """
CREATE TABLE IF NOT EXISTS soak_applied (
    campaign_id text   PRIMARY KEY,
    applied     bigint NOT NULL,
    last_i      bigint NOT NULL,
    repeats     bigint NOT NULL,
    gaps        bigint NOT NULL
)
"""
TALLY = """
INSERT INTO soak_applied AS t (campaign_id, applied, last_i, repeats, gaps)
VALUES ($1, 1, $2::bigint, 0, ($2::bigint <> 0)::int)
ON CONFLICT (campaign_id) DO UPDATE
SET applied = t.applied + 1,
    last_i  = greatest(t.last_i, excluded.last_i),
    repeats = t.repeats + (excluded.last_i <= t.last_i)::int,
    gaps    = t.gaps + (excluded.last_i > t.last_i + 1)::int
"""

app = Outbox()


@app.projector("tally", events=[EVENT_TYPE], ordered=False)
async def tally(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute(TALLY, event.campaign_id, event.payload["i"])


def _snapshots(directory: Path, every: float) -> None:
    n = 0
    while True:
        time.sleep(every)
        n += 1
        tracemalloc.take_snapshot().dump(str(directory / f"{os.getpid()}-{n:03d}.snap"))


if "SOAK_TRACEMALLOC" in os.environ:
    _where = Path(os.environ["SOAK_TRACEMALLOC"])
    _where.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(8)
    threading.Thread(
        target=_snapshots,
        args=(_where, float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "120"))),
        daemon=True,
    ).start()
