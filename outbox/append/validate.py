"""An append's arguments made into the append function's: what Python must check itself.

`prepare()` turns an append's arguments into a `Batch`: the append function's arguments, the
events encoded as one JSON array. The append function (`outbox_try_append`, `call_fn.sql`) is
the authority on every rule an append keeps, for every language (ids, counts, types, sizes,
the events' shape, the metadata's key): a refusal comes back as a row, raised as the same
`ValidationError` in Python, and the caller's transaction stays usable. This module refuses
only what cannot reach the function as it is: arguments of the wrong Python type, values JSON
cannot carry (NaN, infinities, objects it cannot encode, non-string keys) and NUL characters
(text and jsonb cannot hold one). Pure: no I/O. `check_identifier` serves the dedup guard's
ids, which no SQL function checks.
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
    "Batch",
    "check_identifier",
    "prepare",
]

# The metadata field that carries an append's idempotency key into each of its events, so a
# projector can pass it on to an external system (docs/idempotency.md).
KEY_METADATA = "idempotency_key"


@dataclass(frozen=True, slots=True)
class Batch:
    """An append, checked and encoded: the arguments of the append function
    (`outbox_try_append`), the events as one JSON array of {type, payload, metadata[,
    version]}."""

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
    if _JSON_NUL.search(encoded):
        raise ValidationError(field, "must not contain NUL characters (\\u0000)")
    return encoded.decode()


def _text(field: str, value: object) -> str:
    """A string PostgreSQL can hold (no NUL); its length and blankness are the function's."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


def prepare(
    campaign_id: object,
    events: object,
    expected_seq: object,
    idempotency_key: object,
) -> Batch:
    """Check what only Python can and encode the events (see the module docstring)."""
    campaign = _text("campaign_id", campaign_id)
    if isinstance(events, Event) or not isinstance(events, Sequence) or isinstance(events, str):
        raise ValidationError("events", "expected a sequence of outbox.Event")
    expected: int | None = None
    if expected_seq is not None:
        if isinstance(expected_seq, bool) or not isinstance(expected_seq, int):
            raise ValidationError("expected_seq", f"expected an integer >= 0, got {expected_seq!r}")
        expected = expected_seq
    key = None if idempotency_key is None else _text("idempotency_key", idempotency_key)
    encoded: list[str] = []
    traced = tracing.carrier()  # the caller's span, recorded in each event (pg-outbox[tracing])
    for i, event in enumerate(events):
        if not isinstance(event, Event):
            raise ValidationError(
                f"events[{i}]", f"expected outbox.Event, got {type(event).__name__}"
            )
        kind = _text(f"events[{i}].type", event.type)
        payload = _encode(f"events[{i}].payload", event.payload)
        meta: object = event.metadata
        if meta is None or isinstance(meta, Mapping):
            meta = dict(meta or {})
            if traced is not None:
                meta.setdefault(tracing.TRACE_METADATA, traced)
        metadata = _encode(f"events[{i}].metadata", meta)
        version = event.version
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValidationError(
                f"events[{i}].version", f"expected an integer from 1, got {version!r}"
            )
        # A version other than 1 travels as a key (the append function checks its range);
        # version 1, the default, as before versions existed.
        tail = "" if version == 1 else f',"version":{version}'
        encoded.append(
            f'{{"type":{orjson.dumps(kind).decode()},"payload":{payload},"metadata":{metadata}'
            f"{tail}}}"
        )
    return Batch(campaign, f"[{','.join(encoded)}]", len(encoded), expected, key)
