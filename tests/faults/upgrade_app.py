"""The rolling upgrade's application (test_upgrade_faults.py): what one service runs in every
release, old and new alike, so it uses only the API both have (`Outbox`, `projector`, `append`).

- `upgrade_app:app`: `witness` (unordered) and `ledger` (ordered), each recording what it
  applied, as the fault tier's apps do (`faults_app.SCHEMA`'s tables).
- Run as a script, an appender: one writer per campaign named on the command line, each
  appending 3 events at a time, keyed, at the campaign's head (`expected_seq`), until SIGTERM.
  It prints one JSON line per append known to have committed (`{"campaign", "uids"}`): the
  scenario's oracle, written by the generator, never read back from what the workers saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid

import outbox
from outbox import db
from outbox.model import StoredEvent
from outbox.projection.app import Outbox

app = Outbox()


WITNESS = "INSERT INTO fault_applied (campaign_id, uid, i) VALUES ($1, $2, $3)"
LEDGER = "INSERT INTO fault_tracked (projector, campaign_id, uid, i) VALUES ('ledger', $1, $2, $3)"


@app.projector("witness", events=["step"], ordered=False)
async def witness(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute(WITNESS, event.campaign_id, event.payload["uid"], event.payload["i"])


@app.projector("ledger", events=["step"])
async def ledger(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute(LEDGER, event.campaign_id, event.payload["uid"], event.payload["i"])


HEAD = "SELECT coalesce(max(seq), 0) FROM outbox.event_journal WHERE campaign_id = $1"


async def _writer(pool: db.Pool, campaign: str, prefix: str, stopping: asyncio.Event) -> None:
    n = 0
    while not stopping.is_set():
        n += 1
        head = await pool.fetchval(HEAD, campaign)  # this writer is the campaign's only one
        uids = [uuid.uuid4().hex for _ in range(3)]
        events = [outbox.Event("step", {"uid": u, "i": head + j}) for j, u in enumerate(uids)]
        while True:  # until the append is known to have happened: retried with its key
            try:
                await outbox.append(
                    pool, campaign, events, expected_seq=head, idempotency_key=f"{prefix}{n}"
                )
                break
            except outbox.AppendOutcomeUnknown:
                await asyncio.sleep(0.1)
        print(json.dumps({"campaign": campaign, "uids": uids}), flush=True)
        await asyncio.sleep(0.02)  # a service's pace


async def main(campaigns: list[str]) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    pool = await outbox.create_pool(os.environ["OUTBOX_DSN"], max_size=len(campaigns))
    prefix = f"{uuid.uuid4().hex[:8]}-"  # this process's keys: a later appender has its own
    try:
        await asyncio.gather(*(_writer(pool, c, prefix + c, stopping) for c in campaigns))
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
