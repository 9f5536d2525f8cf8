"""A campaign's bucket: where its rows live.

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
from typing import TYPE_CHECKING, TypeVar
from weakref import WeakKeyDictionary

from outbox import db
from outbox.queries import Queries, current_schema

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = [
    "DEFAULT_COUNT",
    "MAX_COUNT",
    "SPAN",
    "bucket_count",
    "bucket_for",
    "bucket_of",
    "filter_bucket",
    "grouped",
    "locator",
]

DEFAULT_COUNT = 64
MAX_COUNT = 4096
# A batch's bucket on one server: its claim took what was due in every bucket, and the
# statements that say so read each campaign in its own (`outbox_bucket_in`, SQL). Citus never
# sees it: there a batch claims in one bucket, routed to its shard.
SPAN = -1

T = TypeVar("T")


class KeyQueries(Queries):
    get_bucket_count: str


Q = KeyQueries

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


async def locator(
    conn: Connection, bucket: int | None = None, *, span: bool = False
) -> Callable[[str], int]:
    """campaign -> its bucket: `bucket` for every campaign, when the caller knows them all to
    be in it (a worker's batch claims in one bucket), else each one's, hashed once. `SPAN` (a
    batch across buckets) stays `SPAN` for a caller whose statements take it (`span`), else
    each campaign gets its own."""
    if bucket is not None and (span or bucket != SPAN):
        return lambda _campaign: bucket
    count = await bucket_count(conn)
    known: dict[str, int] = {}

    def where(campaign_id: str) -> int:
        found = known.get(campaign_id)
        if found is None:
            found = known[campaign_id] = bucket_of(campaign_id, count)
        return found

    return where


async def grouped(
    conn: Connection,
    items: Iterable[T],
    campaign: Callable[[T], str],
    *,
    bucket: int | None = None,
    span: bool = False,
) -> dict[int, list[T]]:
    """`items` by the bucket of their campaign (`campaign(item)`; all in `bucket` when the
    caller knows it), each group in the items' order, the buckets in ascending order (a fixed
    lock order across buckets). Each campaign is hashed once: a batch's rows, markers and
    checkpoints name few campaigns many times. `span`: the statements the groups go to take
    `SPAN` (one group, each campaign read in its own bucket), see `locator`."""
    where = await locator(conn, bucket, span=span)
    groups: dict[int, list[T]] = {}
    for item in items:
        groups.setdefault(where(campaign(item)), []).append(item)
    return dict(sorted(groups.items()))
