"""The batch walk: which claimed rows a batch takes, per campaign in seq order (no database)."""

from __future__ import annotations

from datetime import UTC, datetime

from outbox.queue.claim import ClaimedCampaign, ClaimedRow
from outbox.worker.walk import walk

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def row(
    cid: str, seq: int, *, status: str = "pending", due: bool = True, kind: str = "t"
) -> ClaimedRow:
    return ClaimedRow(cid, seq, status, 0, NOW, due, kind, {}, {}, NOW)


def campaign(cid: str, *rows: ClaimedRow, first: int | None = None) -> ClaimedCampaign:
    seqs = [r.seq for r in rows]
    return ClaimedCampaign(
        cid, list(rows), first if first is not None else min(seqs), max(seqs), {}
    )


def keys(rows: list[ClaimedRow]) -> list[tuple[str, int]]:
    return [r.key for r in rows]


def test_rows_go_per_campaign_in_seq_order_up_to_the_limit() -> None:
    claimed = [campaign("a", row("a", 1), row("a", 2)), campaign("b", row("b", 5), row("b", 6))]
    assert keys(walk(claimed, limit=10, park=False)) == [("a", 1), ("a", 2), ("b", 5), ("b", 6)]
    assert keys(walk(claimed, limit=3, park=False)) == [("a", 1), ("a", 2), ("b", 5)]


def test_a_row_not_due_ends_its_campaign_but_not_the_batch() -> None:
    claimed = [
        campaign("a", row("a", 1), row("a", 2, status="failed", due=False), row("a", 3)),
        campaign("b", row("b", 1)),
    ]
    assert keys(walk(claimed, limit=10, park=False)) == [("a", 1), ("b", 1)]


def test_under_block_a_dead_row_before_the_head_holds_the_campaign() -> None:
    # The campaign's first outstanding row (seq 1, dead) lies before the claimed head (seq 2).
    claimed = [campaign("a", row("a", 2), row("a", 3), first=1), campaign("b", row("b", 1))]
    assert keys(walk(claimed, limit=10, park=False)) == [("b", 1)]


def test_under_park_dead_rows_step_aside() -> None:
    claimed = [campaign("a", row("a", 1, status="dead", due=False), row("a", 2), first=1)]
    assert keys(walk(claimed, limit=10, park=True)) == [("a", 2)]
    assert keys(walk(claimed, limit=10, park=False)) == []


def test_a_leased_type_is_its_campaigns_last_row_in_the_batch() -> None:
    claimed = [campaign("a", row("a", 1), row("a", 2, kind="mail"), row("a", 3))]
    taken = walk(claimed, limit=10, park=False, stop_after=frozenset({"mail"}))
    assert keys(taken) == [("a", 1), ("a", 2)]


def test_without_ordering_every_due_row_goes() -> None:
    claimed = [campaign("a", row("a", 1, due=False), row("a", 2), row("a", 3, kind="mail"))]
    taken = walk(claimed, limit=10, park=False, ordered=False, stop_after=frozenset({"mail"}))
    assert keys(taken) == [("a", 2), ("a", 3)]
