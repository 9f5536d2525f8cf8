"""S4: bad append input is refused before any write, with an error naming the field."""

from __future__ import annotations

from typing import Any

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
