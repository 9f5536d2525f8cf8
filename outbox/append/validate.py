"""Append input checked before anything is written: ids, types, keys, payloads, metadata.

`prepare()` turns an append's arguments into a `Batch`: the append function's arguments, the
events encoded as one JSON array. The append function (`outbox_try_append`, migration 0006)
enforces every rule for every client; this module checks the same rules first, so a bad call
from Python costs no round trip, raises a `ValidationError` naming the field, and leaves the
caller's transaction usable. It also refuses what cannot reach the server as it is: values
JSON cannot carry (NaN, non-string keys), NUL characters. A test runs every bad input through
both and compares. Pure: no I/O. `check_identifier` also serves the dedup guard's ids.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from outbox.errors import ValidationError
from outbox.model import Event
from outbox.obs import tracing

__all__ = [
    "KEY_METADATA",
    "MAX_EVENTS",
    "MAX_ID_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_TYPE_LENGTH",
    "Batch",
    "check_identifier",
    "prepare",
]

MAX_ID_LENGTH = 256
MAX_TYPE_LENGTH = 256
MAX_KEY_LENGTH = 256
MAX_EVENTS = 10_000
MAX_PAYLOAD_BYTES = 1 << 20
# The metadata field that carries an append's idempotency key into each of its events, so a
# projector can pass it on to an external system (docs/idempotency.md).
KEY_METADATA = "idempotency_key"


@dataclass(frozen=True, slots=True)
class Batch:
    """An append, checked and encoded: the arguments of the append function
    (`outbox_try_append`), the events as one JSON array of {type, payload, metadata}."""

    campaign_id: str
    events: str
    count: int
    expected_seq: int | None
    idempotency_key: str | None


# jsonb cannot store U+0000; orjson writes it as \u0000 (an even run of backslashes before it
# means the backslash itself was escaped, and the text is harmless).
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_identifier(field: str, value: object, limit: int) -> str:
    """A non-blank string of at most `limit` characters without NUL, or a ValidationError
    naming `field` (ids, types and keys, here and in the dedup guard)."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > limit:
        raise ValidationError(field, f"must be at most {limit} characters, got {len(value)}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


def _check_finite(field: str, value: Any) -> None:
    # orjson writes NaN and infinities as null; refuse them instead of losing data silently.
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(field, "NaN and infinite numbers are not JSON")
    elif isinstance(value, Mapping):
        for item in value.values():
            _check_finite(field, item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_finite(field, item)


def _encode(field: str, value: Any) -> str:
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:
        raise ValidationError(field, f"not JSON-encodable: {exc}") from None
    _check_finite(field, value)
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            field, f"encodes to {len(encoded)} bytes, more than {MAX_PAYLOAD_BYTES}"
        )
    if _JSON_NUL.search(encoded):
        raise ValidationError(field, "must not contain NUL characters (\\u0000)")
    return encoded.decode()


def prepare(
    campaign_id: object,
    events: object,
    expected_seq: object,
    idempotency_key: object,
) -> Batch:
    """Validate everything and encode the payloads, before anything is written."""
    campaign = check_identifier("campaign_id", campaign_id, MAX_ID_LENGTH)
    if isinstance(events, Event) or not isinstance(events, Sequence) or isinstance(events, str):
        raise ValidationError("events", "expected a sequence of outbox.Event")
    if not events:
        raise ValidationError("events", "must not be empty")
    if len(events) > MAX_EVENTS:
        raise ValidationError("events", f"at most {MAX_EVENTS} per append, got {len(events)}")
    expected: int | None = None
    if expected_seq is not None:
        if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0:
            raise ValidationError("expected_seq", f"expected an integer >= 0, got {expected_seq!r}")
        expected = expected_seq
    key: str | None = None
    if idempotency_key is not None:
        key = check_identifier("idempotency_key", idempotency_key, MAX_KEY_LENGTH)
    encoded: list[str] = []
    traced = tracing.carrier()  # the caller's span, recorded in each event (outbox[tracing])
    for i, event in enumerate(events):
        if not isinstance(event, Event):
            raise ValidationError(
                f"events[{i}]", f"expected outbox.Event, got {type(event).__name__}"
            )
        kind = check_identifier(f"events[{i}].type", event.type, MAX_TYPE_LENGTH)
        payload = _encode(f"events[{i}].payload", event.payload)
        if event.metadata is not None and not isinstance(event.metadata, Mapping):
            raise ValidationError(f"events[{i}].metadata", "expected a mapping or None")
        meta = dict(event.metadata or {})
        if key is not None and meta.get(KEY_METADATA, key) != key:
            raise ValidationError(
                f"events[{i}].metadata",
                f"{KEY_METADATA!r} is set by the append from its idempotency_key; got a "
                "different value",
            )
        if traced is not None:
            meta.setdefault(tracing.TRACE_METADATA, traced)
        metadata = _encode(f"events[{i}].metadata", meta)
        encoded.append(
            f'{{"type":{orjson.dumps(kind).decode()},"payload":{payload},"metadata":{metadata}}}'
        )
    return Batch(campaign, f"[{','.join(encoded)}]", len(encoded), expected, key)
