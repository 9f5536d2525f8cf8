"""Buckets: where a campaign's rows live.

Every campaign-keyed row carries `bucket = outbox_bucket(campaign_id)`: the first 32 bits of the
id's MD5 modulo N, where N (`OUTBOX_BUCKETS`, default 64) was fixed when the schema was first
migrated. `bucket_of` is the function's twin, so a statement names its bucket as a parameter
(`bucket = $n`): on Citus, where the tables are distributed by bucket, that routes it to one
shard; on plain PostgreSQL it reads one bucket's part of an index. A batch claims and settles in
one bucket; the statements here that take several campaigns are run once per bucket
(`grouped`). N is read from the schema once per connection (`bucket_count`), never assumed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar
from weakref import WeakKeyDictionary

from outbox import db
from outbox.queries import Queries, current_schema

if TYPE_CHECKING:
    from outbox.db import Connection, Executor

__all__ = [
    "DEFAULT_COUNT",
    "MAX_COUNT",
    "bucket_count",
    "bucket_for",
    "bucket_of",
    "due_buckets",
    "filter_bucket",
    "grouped",
]

DEFAULT_COUNT = 64
MAX_COUNT = 4096

T = TypeVar("T")


class BucketQueries(Queries):
    get_bucket_count: str
    list_due_buckets: str


Q = BucketQueries

# The install's N per (raw) connection and schema: read once, the first time a connection needs
# it (two installs in one database may have different numbers).
_counts: WeakKeyDictionary[object, dict[str, int]] = WeakKeyDictionary()


def bucket_of(campaign_id: str, count: int) -> int:
    """The bucket of `campaign_id` among `count`: `outbox_bucket(campaign_id)` in Python."""
    digest = hashlib.md5(campaign_id.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % count


async def bucket_count(conn: Connection) -> int:
    """How many buckets the schema on `conn` has (cached per connection)."""
    known = _counts.setdefault(db.raw_connection(conn), {})
    schema = current_schema()
    count = known.get(schema)
    if count is None:
        count = known[schema] = int(await conn.fetchval(Q.get_bucket_count))
    return count


async def bucket_for(conn: Connection, campaign_id: str) -> int:
    """The bucket of `campaign_id` in the schema on `conn`."""
    return bucket_of(campaign_id, await bucket_count(conn))


async def filter_bucket(conn: Connection, campaign_id: str | None) -> int | None:
    """The bucket of an optional campaign filter (None: every bucket)."""
    return None if campaign_id is None else await bucket_for(conn, campaign_id)


async def grouped(
    conn: Connection, items: Iterable[T], campaign: Callable[[T], str]
) -> dict[int, list[T]]:
    """`items` by the bucket of their campaign (`campaign(item)`), each group in the items'
    order, the buckets in ascending order (a fixed lock order across buckets). Each campaign
    is hashed once: a batch's rows, markers and checkpoints name few campaigns many times."""
    count = await bucket_count(conn)
    known: dict[str, int] = {}
    groups: dict[int, list[T]] = {}
    for item in items:
        campaign_id = campaign(item)
        bucket = known.get(campaign_id)
        if bucket is None:
            bucket = known[campaign_id] = bucket_of(campaign_id, count)
        groups.setdefault(bucket, []).append(item)
    return dict(sorted(groups.items()))


async def due_buckets(
    executor: Executor, *, rows: bool, now: datetime | None = None
) -> list[tuple[int, float]]:
    """(bucket, seconds until due by the database clock or `now`; <= 0: due now) for every
    bucket with work: campaign rows, or live work rows (`rows`, ordering `none`). One index
    probe per bucket."""
    async with db.acquire(executor) as conn:
        records = await conn.fetch(Q.list_due_buckets, rows, now)
    return [(r["bucket"], r["due_in"]) for r in records]
