"""Django: a view inside `transaction.atomic()` appends on Django's own connection; the events
commit and roll back with the view's writes (the site in tests/django_site, run as a
subprocess with its own settings module)."""

from __future__ import annotations

import os
import sys

import anyio
import orjson

from helpers import TESTS, counts, journal_seqs
from outbox import db


async def test_a_django_view_appends_in_its_atomic_block(pool: db.Pool, dsn: str) -> None:
    await pool.execute("CREATE TABLE domain_rows (id text PRIMARY KEY)")
    await pool.execute("CREATE TABLE orders (id text PRIMARY KEY)")  # docs/append.md's table
    with anyio.fail_after(120):
        proc = await anyio.run_process(
            [sys.executable, str(TESTS / "django_site" / "run.py")],
            cwd=TESTS,
            env={**os.environ, "OUTBOX_DJANGO_DSN": dsn, "PYTHONPATH": str(TESTS)},
            check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    answers = orjson.loads(proc.stdout)
    assert answers["committed"] == {"first_seq": 1, "last_seq": 1, "duplicate": False}
    assert answers["rolled_back"] == answers["first_then_rolled_back"] == "refused"
    assert answers["keyed"] == {"first_seq": 1, "last_seq": 1, "duplicate": False}
    assert answers["retried"] == {"first_seq": 1, "last_seq": 1, "duplicate": True}
    assert answers["docs"] == 1  # docs/append.md's Django example, as written
    assert answers["docs_retried"] is True  # its retry: a duplicate, nothing written again
    assert await pool.fetchval("SELECT count(*) FROM orders WHERE id = 'o-docs'") == 1
    # What committed: two orders and their events; nothing of the two refused requests.
    rows = [r["id"] for r in await pool.fetch("SELECT id FROM domain_rows ORDER BY id")]
    assert rows == ["o-1", "o-2"]
    assert await journal_seqs(pool, "order-o-1") == [1]
    assert await journal_seqs(pool, "order-o-2") == [1]
    assert (await counts(pool))["event_journal"] == 3  # o-1, o-2 and the docs' o-docs
