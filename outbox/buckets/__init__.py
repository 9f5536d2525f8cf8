"""Buckets: where a campaign's rows live, which ones a worker claims from, and the cluster.

    key           a campaign's bucket (`bucket_of`, the SQL function's twin), the install's
                  number of buckets, work grouped by bucket (`grouped`, `locator`)
    ring          which bucket a worker's next batch claims from (`BucketRing`), read from
                  `outbox_due_buckets` (ring_fn.sql)
    distribution  `maintenance distribute`: the tables' placement on a Citus cluster

A batch claims and settles in one bucket and passes it to every statement it runs, so none
works it out again; paths that span campaigns (an operator's, inline apply) group by bucket
here, each campaign hashed once. The public names are re-exported here.
"""

from outbox.buckets.key import (
    DEFAULT_COUNT,
    MAX_COUNT,
    SPAN,
    bucket_count,
    bucket_for,
    bucket_of,
    filter_bucket,
    grouped,
    locator,
)
from outbox.buckets.ring import BucketRing, due_buckets

__all__ = [
    "DEFAULT_COUNT",
    "MAX_COUNT",
    "SPAN",
    "BucketRing",
    "bucket_count",
    "bucket_for",
    "bucket_of",
    "due_buckets",
    "filter_bucket",
    "grouped",
    "locator",
]
