"""The outbox's tables on a Citus cluster: `maintenance distribute`.

Every table keyed by campaign is distributed by `bucket` and co-located with the journal, so
one bucket's journal events, heads, work rows, campaign row, checkpoints, markers and append
keys sit on one shard, and a statement that names its bucket is one router task. The consumer
dedup guard's claims (keyed by external event, not campaign) are distributed by `event_id` in
a group of their own. The bookkeeping tables (migrations, the worker registry, pauses and the
audits) stay local to the coordinator: no statement joins them with a distributed table.

`distribute()` is idempotent: a table already distributed as planned is left as it is, so a
run that stopped half way is finished by running it again. A table distributed otherwise (by
another column, in another group) is refused by name: moving it is the operator's decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox import schema
from outbox.buckets import key
from outbox.errors import UsageError
from outbox.obs import log
from outbox.queries import Queries

if TYPE_CHECKING:
    from outbox.db import Connection

__all__ = ["ANCHOR", "PLAN", "Distributed", "Placement", "distribute"]

_logger = log.get_logger("outbox.distribution")

# The first table distributed; the others of its group are co-located with it.
ANCHOR = "event_journal"


@dataclass(frozen=True, slots=True)
class Placement:
    """One table as planned: its distribution column and the table it is co-located with
    (None: a group of its own)."""

    table: str
    column: str
    colocate_with: str | None


PLAN: tuple[Placement, ...] = (
    Placement(ANCHOR, "bucket", None),
    *(
        Placement(table, "bucket", ANCHOR)
        for table in (
            "campaign_head_keys",
            "projection_apply_outbox",
            "projection_apply_campaigns",
            "projection_checkpoint_keys",
            "projection_checkpoint_moves",
            "projection_holds",
            "processed_markers",
            "append_idempotency_keys",
        )
    ),
    Placement("consumer_claims", "event_id", None),
)


class DistributionQueries(Queries):
    get_citus_version: str
    get_citus_coordinator: str
    list_citus_tables: str
    count_citus_nodes: str
    create_distributed_table: str
    reset_plans: str


Q = DistributionQueries


@dataclass(frozen=True, slots=True)
class TableState:
    """`maintenance distribute`, per table: `state` is `distributed` (by this run) or
    `already` (left as it was)."""

    table: str
    column: str
    colocated_with: str | None
    shards: int
    state: str


@dataclass(frozen=True, slots=True)
class Distributed:
    """`maintenance distribute`: the Citus version, the nodes that hold shards, the number of
    buckets and of shards per table, and each table's placement."""

    citus_version: str
    nodes: int
    buckets: int
    shard_count: int
    tables: list[TableState]


async def _existing(conn: Connection) -> dict[str, tuple[str | None, int, int]]:
    rows = await conn.fetch(Q.list_citus_tables)
    return {r["table_name"]: (r["column_name"], r["colocation_id"], r["shards"]) for r in rows}


async def distribute(conn: Connection, *, shard_count: int | None = None) -> Distributed:
    """Distribute the outbox's tables on the Citus coordinator `conn` is connected to (see the
    module's text). `shard_count`: shards per table, default one per bucket, so the rebalancer
    moves single buckets; at most the number of buckets."""
    version: str | None = await conn.fetchval(Q.get_citus_version)
    if version is None:
        raise UsageError(
            "not a Citus database: CREATE EXTENSION citus (on every node) and add the worker "
            "nodes first"
        )
    if not await conn.fetchval(Q.get_citus_coordinator):
        raise UsageError(
            "this is a Citus worker node: run `maintenance distribute` on the coordinator"
        )
    await schema.check_current(conn)
    count = await key.bucket_count(conn)
    shards = shard_count if shard_count is not None else count
    if not 1 <= shards <= count:
        raise UsageError(f"--shard-count must be between 1 and the number of buckets ({count})")
    existing = await _existing(conn)
    groups: dict[str, int] = {}
    states: list[TableState] = []
    for plan in PLAN:
        found = existing.get(plan.table)
        state = "already"
        if found is None:
            group = "none" if plan.colocate_with is None else plan.colocate_with
            await conn.execute(
                Q.create_distributed_table,
                plan.table,
                plan.column,
                group,
                shards if plan.colocate_with is None else None,
            )
            _logger.info("distribution.table", extra={"table": plan.table, "column": plan.column})
            found = (await _existing(conn))[plan.table]
            state = "distributed"
        column, group_id, table_shards = found
        wanted_group = groups.get(plan.colocate_with or "", group_id)
        if column != plan.column or group_id != wanted_group:
            raise UsageError(
                f"{plan.table} is already distributed, by {column or 'nothing (reference)'} in "
                f"co-location group {group_id}; the outbox needs it by {plan.column}"
                + (f", co-located with {plan.colocate_with}" if plan.colocate_with else "")
                + ": undistribute it (undistribute_table) and run distribute again"
            )
        groups[plan.table] = group_id
        states.append(TableState(plan.table, plan.column, plan.colocate_with, table_shards, state))
    await conn.fetchval(Q.reset_plans)
    nodes: int = await conn.fetchval(Q.count_citus_nodes)
    return Distributed(version, nodes, count, states[0].shards, states)
