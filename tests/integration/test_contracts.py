"""The server functions' contracts, pinned: what workers and other languages of an earlier
release call must still be there, with the same arguments and result, after this release's
migrate, so a rolling deploy runs old and new workers side by side.

`function_contracts.json` holds each function's identity arguments and result as PostgreSQL
prints them: under `released`, what each release shipped (never edited: a function whose
arguments or result change gets a new name, `outbox_claim_v2`, and the old definition stays
until the release after the next, when a migration drops it and its pin goes in the same
commit); under `unreleased`, what this release adds so far, rewritten by
`OUTBOX_PIN_CONTRACTS=write` while it is developed. A release moves `unreleased` into
`released` under its version.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from outbox import db

PINS = Path(__file__).with_name("function_contracts.json")


async def _contracts(pool: db.Pool) -> dict[str, str]:
    rows = await pool.fetch(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments, "
        "pg_get_function_result(p.oid) AS result FROM pg_proc p "
        "WHERE p.pronamespace = 'outbox'::regnamespace ORDER BY 1, 2"
    )
    return {f"{r['proname']}({r['arguments']})": r["result"] for r in rows}


async def test_every_released_contract_holds_and_every_function_is_pinned(pool: db.Pool) -> None:
    found = await _contracts(pool)
    pins = orjson.loads(PINS.read_bytes())
    released: dict[str, str] = {
        k: v for shipped in pins["released"].values() for k, v in shipped.items()
    }
    if os.environ.get("OUTBOX_PIN_CONTRACTS") == "write":
        pins["unreleased"] = {k: v for k, v in found.items() if k not in released}
        PINS.write_bytes(
            orjson.dumps(pins, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )
    changed = {k: (v, found.get(k)) for k, v in released.items() if found.get(k) != v}
    assert changed == {}, (
        "a function workers of a release call changed or went away: keep it, and give the new "
        "contract a new name (outbox_claim_v2)"
    )
    unpinned = sorted(set(found) - set(released) - set(pins["unreleased"]))
    assert unpinned == [], "new or changed functions: pin them with OUTBOX_PIN_CONTRACTS=write"
    stale = sorted(set(pins["unreleased"]) - set(found))
    assert stale == [], "pins of functions that are gone: OUTBOX_PIN_CONTRACTS=write"
