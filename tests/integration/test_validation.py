"""S4: bad append input is refused before any write, with an error naming the field."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import orjson
import pytest

import outbox
from helpers import counts
from outbox import Event, Settings, append, db

CASES: list[tuple[dict[str, Any], str]] = [
    ({"campaign_id": ""}, "campaign_id"),
    ({"campaign_id": "   "}, "campaign_id"),
    ({"campaign_id": 42}, "campaign_id"),
    ({"campaign_id": "x" * 257}, "campaign_id"),
    ({"campaign_id": "a\x00b"}, "campaign_id"),
    ({"events": []}, "events"),
    ({"events": Event("t", {})}, "events"),
    ({"events": "not events"}, "events"),
    ({"events": [Event("ok", {}), {"type": "t"}]}, "events[1]"),
    ({"events": [Event("", {})]}, "events[0].type"),
    ({"events": [Event("t" * 257, {})]}, "events[0].type"),
    ({"events": [Event("ok", {}), Event("t", {"when": object()})]}, "events[1].payload"),
    ({"events": [Event("t", {1: "non-str key"})]}, "events[0].payload"),
    ({"events": [Event("t", {"x": float("nan")})]}, "events[0].payload"),
    ({"events": [Event("t", [1.0, float("inf")])]}, "events[0].payload"),
    ({"events": [Event("t", {"s": "nul\x00inside"})]}, "events[0].payload"),
    ({"events": [Event("t", "x" * (1 << 20))]}, "events[0].payload"),
    ({"events": [Event("t", {}, metadata=["not", "a", "mapping"])]}, "events[0].metadata"),  # type: ignore[arg-type]
    ({"events": [Event("t", {}, metadata={"bad": {1, 2}})]}, "events[0].metadata"),
    ({"expected_seq": -1}, "expected_seq"),
    ({"expected_seq": True}, "expected_seq"),
    ({"expected_seq": "3"}, "expected_seq"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"idempotency_key": "k" * 257}, "idempotency_key"),
]


@pytest.mark.parametrize(
    ("override", "field"), CASES, ids=[c[1] + ":" + repr(c[0])[:40] for c in CASES]
)
async def test_invalid_input_names_the_field_and_writes_nothing(
    pool: db.Pool, settings: Settings, override: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"campaign_id": "c", "events": [Event("t", {"ok": True})]}
    args.update(override)
    kwargs = {k: args.pop(k) for k in ("expected_seq", "idempotency_key") if k in args}
    with pytest.raises(outbox.ValidationError) as info:
        await append(pool, args["campaign_id"], args["events"], settings=settings, **kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert "\n" not in str(info.value)
    assert set((await counts(pool)).values()) == {0}


async def test_escaped_backslash_u0000_text_is_accepted(pool: db.Pool, settings: Settings) -> None:
    # The six characters \u0000 are ordinary text, not a NUL.
    result = await append(pool, "c", [Event("t", {"s": "\\u0000"})], settings=settings)
    assert result.first_seq == 1
    assert await pool.fetchval("SELECT payload->>'s' FROM outbox.event_journal") == "\\u0000"


async def test_what_python_must_check_comes_before_the_settings_are_read(
    pool: db.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_ENABLED", "maybe")
    with pytest.raises(outbox.ValidationError):
        await append(pool, 42, [Event("t", {})])  # type: ignore[arg-type]
    with pytest.raises(outbox.ConfigError, match="OUTBOX_ENABLED"):
        await append(pool, "c", [Event("t", {})])
    assert set((await counts(pool)).values()) == {0}


# Every rule of the append function that a Python caller can break: `outbox.append` and
# `outbox.outbox_append` (OB001, the field in DETAIL) refuse each with the same field and text.
PARITY: list[tuple[str, list[dict[str, Any]], int | None, str | None]] = [
    ("", [{"type": "t", "payload": {}}], None, None),
    ("   ", [{"type": "t", "payload": {}}], None, None),
    ("x" * 257, [{"type": "t", "payload": {}}], None, None),
    ("c", [], None, None),
    ("c", [{"type": "t", "payload": {}}] * 10_001, None, None),
    ("c", [{"type": "ok", "payload": {}}, {"type": "", "payload": {}}], None, None),
    ("c", [{"type": "  ", "payload": {}}], None, None),
    ("c", [{"type": "t" * 257, "payload": {}}], None, None),
    ("c", [{"type": "t", "payload": "x" * (1 << 20)}], None, None),
    ("c", [{"type": "t", "payload": {}, "metadata": ["not", "an", "object"]}], None, None),
    ("c", [{"type": "t", "payload": {}, "metadata": 7}], None, None),
    ("c", [{"type": "t", "payload": {}}], -1, None),
    ("c", [{"type": "t", "payload": {}}], None, ""),
    ("c", [{"type": "t", "payload": {}}], None, "k" * 257),
    ("c", [{"type": "t", "payload": {}, "metadata": {"idempotency_key": "other"}}], None, "k"),
]


PYTHON_WORDS = re.compile(r"\b(None|True|False|dict|list|tuple|str|int|float|bool|mapping)\b", re.I)


async def _refused_in_sql(
    pool: db.Pool, campaign_id: str, events: Any, expected_seq: int | None, key: str | None
) -> tuple[str, str]:
    """(DETAIL, message) of outbox_append's OB001; outbox_try_append says the same as a row."""
    arguments = (campaign_id, orjson.dumps(events).decode(), expected_seq, key)
    with pytest.raises(asyncpg.PostgresError) as raised:
        await pool.fetchrow(
            "SELECT * FROM outbox.outbox_append($1, $2::text::jsonb, $3, $4)", *arguments
        )
    assert raised.value.sqlstate == "OB001"
    row = await pool.fetchrow(
        "SELECT refusal, field, message FROM outbox.outbox_try_append($1, $2::text::jsonb, $3, $4)",
        *arguments,
    )
    assert row is not None
    assert row["refusal"] == "invalid"
    assert f"{row['field']}: {row['message']}" == raised.value.message
    assert raised.value.detail == row["field"]
    # Worded for every language: JSON's and SQL's words, never Python's.
    assert not PYTHON_WORDS.search(raised.value.message), raised.value.message
    return row["field"], raised.value.message


@pytest.mark.parametrize(
    ("campaign_id", "events", "expected_seq", "key"),
    PARITY,
    ids=[f"{i}" for i in range(len(PARITY))],
)
async def test_python_and_the_append_function_refuse_alike(
    pool: db.Pool,
    campaign_id: str,
    events: list[dict[str, Any]],
    expected_seq: int | None,
    key: str | None,
) -> None:
    as_events = [Event(e["type"], e["payload"], e.get("metadata")) for e in events]
    with pytest.raises(outbox.ValidationError) as python:
        await append(pool, campaign_id, as_events, expected_seq=expected_seq, idempotency_key=key)
    field, message = await _refused_in_sql(pool, campaign_id, events, expected_seq, key)
    assert (python.value.field, str(python.value)) == (field, message)
    assert set((await counts(pool)).values()) == {0}


# Rules a Python caller cannot break (its Event always has a type and a payload, and nothing
# else), which another language can: refused alike by both functions, with OB001.
SQL_ONLY: list[tuple[Any, str]] = [
    ([{"type": "t"}], "events[0].payload: is required (null is allowed)"),
    (
        [{"type": "t", "payload": {}, "extra": 1}],
        "events[0]: expected only type, payload, metadata and version",
    ),
    (["t"], "events[0]: expected an object with type, payload and optional metadata and version"),
    (
        [{"type": "t", "payload": {}, "version": 0}],
        "events[0].version: expected an integer from 1, got 0",
    ),
    (
        [{"type": "t", "payload": {}, "version": 1.5}],
        "events[0].version: expected an integer from 1, got 1.5",
    ),
    (
        [{"type": "t", "payload": {}, "version": "2"}],
        'events[0].version: expected an integer from 1, got "2"',
    ),
    ({"type": "t"}, "events: expected a JSON array of events"),
    ([{"payload": {}}], "events[0].type: expected a string"),
    ([{"type": 7, "payload": {}}], "events[0].type: expected a string"),
]


@pytest.mark.parametrize(("events", "message"), SQL_ONLY, ids=[m for _, m in SQL_ONLY])
async def test_the_append_function_refuses_what_other_languages_can_send(
    pool: db.Pool, events: Any, message: str
) -> None:
    assert (await _refused_in_sql(pool, "c", events, None, None))[1] == message
    assert set((await counts(pool)).values()) == {0}


async def test_a_null_payload_is_a_payload(pool: db.Pool) -> None:
    row = await pool.fetchrow(
        'SELECT * FROM outbox.outbox_append(\'c\', \'[{"type": "t", "payload": null}]\')'
    )
    assert row is not None
    stored = await pool.fetchval("SELECT jsonb_typeof(payload) FROM outbox.event_journal")
    assert stored == "null"
