"""Decoding a claim's journal rows in bulk: one decoder call per column, and a row that cannot
be decoded failing alone (S8)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from outbox import db
from outbox.append.journal import decode_bulk

AT = datetime(2026, 11, 24, tzinfo=UTC)


def rows(*columns: tuple[str, str]) -> list[db.Record]:
    """Journal rows as the claim returns them (payload and metadata as jsonb text)."""
    found: list[dict[str, Any]] = [
        {"campaign_id": "c", "seq": i + 1, "event_type": "t", "payload": p, "metadata": m}
        | {"recorded_at": AT}
        for i, (p, m) in enumerate(columns)
    ]
    return cast(list[db.Record], found)


def test_every_row_decodes_in_one_pass() -> None:
    decoded = decode_bulk(rows(('{"n": 1}', "{}"), ("[1, 2]", '{"k": "v"}'), ("null", "{}")))
    assert decoded.payloads == [{"n": 1}, [1, 2], None]
    assert decoded.metadata == [{}, {"k": "v"}, {}]
    assert decoded.unavailable == {}


def test_an_undecodable_row_fails_alone_and_its_neighbours_decode() -> None:
    decoded = decode_bulk(
        rows(('{"n": 1}', "{}"), ('{"v": 1e400}', "{}"), ("2", "[]"), ('"s"', '{"a": 1}'))
    )
    assert sorted(decoded.unavailable) == [1, 2]
    assert "seq 2 cannot be decoded" in str(decoded.unavailable[1])
    assert "seq 3: metadata is not a JSON object" in str(decoded.unavailable[2])
    assert decoded.payloads == [{"n": 1}, None, None, "s"]
    assert decoded.metadata == [{}, None, None, {"a": 1}]


def test_no_rows_is_nothing_to_decode() -> None:
    assert decode_bulk([]).payloads == []
