"""S4: bad append input is refused before any write, with an error naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

import outbox
from helpers import counts
from outbox import Event, Settings, append, db
from outbox.append.validate import prepare

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
    assert await pool.fetchval("SELECT payload->>'s' FROM event_journal") == "\\u0000"


async def test_validation_happens_before_the_settings_are_read(
    pool: db.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_ENABLED", "maybe")
    with pytest.raises(outbox.ValidationError):
        await append(pool, "", [Event("t", {})])
    with pytest.raises(outbox.ConfigError, match="OUTBOX_ENABLED"):
        await append(pool, "c", [Event("t", {})])
    assert set((await counts(pool)).values()) == {0}


# Bad inputs both sides can express (ids, counts, types, keys, metadata, sizes): Python's
# pre-checks and the append function must refuse each with the same field and message.
PARITY: list[tuple[str, list[dict[str, Any]], int | None, str | None]] = [
    ("", [{"type": "t", "payload": {}}], None, None),
    ("   ", [{"type": "t", "payload": {}}], None, None),
    ("x" * 257, [{"type": "t", "payload": {}}], None, None),
    ("c", [], None, None),
    ("c", [{"type": "t", "payload": {}}] * 10_001, None, None),
    ("c", [{"type": "ok", "payload": {}}, {"type": "", "payload": {}}], None, None),
    ("c", [{"type": "t" * 257, "payload": {}}], None, None),
    ("c", [{"type": "t", "payload": "x" * (1 << 20)}], None, None),
    ("c", [{"type": "t", "payload": {}}], -1, None),
    ("c", [{"type": "t", "payload": {}}], None, ""),
    ("c", [{"type": "t", "payload": {}}], None, "k" * 257),
    ("c", [{"type": "t", "payload": {}, "metadata": {"idempotency_key": "other"}}], None, "k"),
]


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
        prepare(campaign_id, as_events, expected_seq, key)
    row = await pool.fetchrow(
        "SELECT refusal, field, message FROM outbox_try_append($1, $2::text::jsonb, $3, $4)",
        campaign_id,
        orjson.dumps(events).decode(),
        expected_seq,
        key,
    )
    assert row is not None
    assert (row["refusal"], row["field"]) == ("invalid", python.value.field)
    assert f"{row['field']}: {row['message']}" == str(python.value)
    assert set((await counts(pool)).values()) == {0}
