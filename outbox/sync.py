"""`outbox.sync.append`: the append for synchronous code, in the caller's own transaction.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE accounts ...")
        outbox.sync.append(conn, "acct-7", [outbox.Event("deposited", {"amount": 5})])

It takes a psycopg Connection, an SQLAlchemy Connection or Session, or Django's connection
(`outbox.contrib.django.append` passes the current one); with autocommit on, the append is a
transaction of its own. Rules, results and errors are those of `outbox.append`: both are the
one append path of `outbox.append.api`, and this module only names its blocking form.
"""

from __future__ import annotations

from outbox.append.api import append_sync as append

__all__ = ["append"]
