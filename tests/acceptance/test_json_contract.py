"""The `--json` contract: every command's JSON keys, in order, pinned against a recorded copy.

Each command runs as a subprocess on a database seeded so that every list it prints has a
member (a dead, a failed, a pending and a leased row, a parked row, a live worker, a shadow
sighting). The keys of each output, in the order they appear (list members merged), must equal
`json_keys.json`: renaming, dropping, adding or reordering a key is a change to the contract
and fails here. After a deliberate change, rewrite the file with OUTBOX_PIN_JSON=write.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from campaigns_demo.app import app as demo_app
from campaigns_demo.app import install
from factories import make_dead, make_failed, make_leased, register_worker

from helpers import run_cli
from outbox import Event, Settings, append, db
from outbox.projection.known import record

PINNED = Path(__file__).with_name("json_keys.json")
APP = "campaigns_demo.app:app"


def key_paths(value: Any, prefix: str = "") -> list[str]:
    """Every key path of `value` in order of appearance; list members share `[]`."""
    paths: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.append(path)
            paths += [p for p in key_paths(item, path) if p not in paths]
    elif isinstance(value, list):
        for item in value:
            paths += [p for p in key_paths(item, f"{prefix}[]") if p not in paths]
    return paths


async def seed(pool: db.Pool, settings: Settings) -> None:
    """Rows in every state a report lists, and events the demo app applies or fails."""
    await install(pool)
    await record(pool, demo_app.registry, "w-1")  # the live worker below runs them (S33)
    await append(pool, "c-dead", [Event("note.added", {"text": "x"})] * 2, settings=settings)
    await append(pool, "c-failed", [Event("note.added", {"text": "x"})] * 2, settings=settings)
    await append(pool, "c-lease", [Event("note.added", {"text": "x"})], settings=settings)
    await append(pool, "c-ok", [Event("note.added", {"text": "x"})], settings=settings)
    await append(pool, "c-curse", [Event("dice.cursed", {"sides": 13})], settings=settings)
    await make_dead(pool, "c-dead", 1)
    await pool.execute(  # a shadow worker saw it once
        "UPDATE outbox.projection_apply_outbox SET seen_count = 1, "
        "first_seen_at = clock_timestamp(), last_seen_at = clock_timestamp() "
        "WHERE campaign_id = 'c-dead' AND seq = 1"
    )
    await make_failed(pool, "c-failed", 1, due_in=-60)
    # On its last attempt: the replay makes it dead, for the requeue to take back.
    await make_failed(pool, "c-curse", attempts=7, due_in=-1)
    await make_leased(pool, "c-lease", owner="w-1", expires_in=-1)
    await register_worker(pool, "w-1", counters={"applied": 3})


def run_json(*args: str, dsn: str, prog: str = "maintenance", ok: bool = True) -> Any:
    proc: subprocess.CompletedProcess[str] = run_cli(
        prog, *args, dsn=dsn, env={"OUTBOX_DEAD_POLICY": "block"}
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return orjson.loads(proc.stdout.splitlines()[-1])  # a long run's progress lines before it


def outputs(dsn: str) -> dict[str, Any]:
    """Every `--json` command's output, named by its command line (order matters: the
    requeues and the drain change the queue the later commands see)."""
    park = run_cli(
        "maintenance", "outbox-report", "--json", dsn=dsn, env={"OUTBOX_DEAD_POLICY": "park"}
    )
    assert park.returncode == 0, park.stderr
    found: dict[str, Any] = {
        "outbox-report": run_json("outbox-report", "--json", dsn=dsn),
        "outbox-report (park)": orjson.loads(park.stdout),
        "health": run_json("health", "--json", dsn=dsn, ok=False),
        "migrate": run_json("migrate", "--json", dsn=dsn),
        "migrate --status": run_json("migrate", "--status", "--json", dsn=dsn),
        "schema": run_json("schema", "--json", dsn=dsn),
        "cleanup": run_json("cleanup", "--json", dsn=dsn),
        "projections-rebuild": run_json("projections-rebuild", "--app", APP, "--json", dsn=dsn),
        "projections-rebuild --yes": run_json(
            "projections-rebuild", "--app", APP, "--yes", "--json", dsn=dsn
        ),
        "reconcile": run_json("reconcile", "--app", APP, "--json", dsn=dsn),
        "reconcile --quiet": run_json("reconcile", "--app", APP, "--quiet", "--json", dsn=dsn),
        "outbox-failures": run_json("outbox-failures", "--json", dsn=dsn),
        "outbox-requeue-dead --dry-run": run_json(
            "outbox-requeue-dead", "--limit", "5", "--dry-run", "--json", dsn=dsn
        ),
        "outbox-requeue-dead --quiet": run_json(
            "outbox-requeue-dead", "--limit", "5", "--dry-run", "--quiet", "--json", dsn=dsn
        ),
        "outbox-replay (applied)": run_json(
            "outbox-replay", "--app", APP, "--campaign-id", "c-ok", "--seq", "1", "--json", dsn=dsn
        ),
        "outbox-replay (failed)": run_json(
            "outbox-replay",
            *("--app", APP, "--campaign-id", "c-curse", "--seq", "1", "--json"),
            dsn=dsn,
            ok=False,
        ),
        "outbox-requeue": run_json(
            "outbox-requeue", "--campaign-id", "c-dead", "--seq", "1", "--json", dsn=dsn
        ),
        "outbox-retry": run_json("outbox-retry", "--limit", "5", "--json", dsn=dsn),
    }
    found["outbox-requeue-dead"] = run_json(
        "outbox-requeue-dead", "--limit", "5", "--json", dsn=dsn
    )
    found["outbox-worker --drain-now"] = run_json(
        "--app", APP, "--drain-now", "--json", dsn=dsn, prog="outbox-worker"
    )
    found["outbox-worker --drain"] = run_json(
        "--app", APP, "--drain", "--json", "--backoff-base", "0.01", dsn=dsn, prog="outbox-worker"
    )
    # The drain leaves c-curse dead again: discard it, then read the audit of it all.
    found["outbox-discard"] = run_json(
        "outbox-discard",
        *("--app", APP, "--campaign-id", "c-curse", "--seq", "1", "--reason", "cursed"),
        "--json",
        dsn=dsn,
    )
    found["audit"] = run_json("audit", "--json", dsn=dsn)
    found["projector-pause"] = run_json(
        "projector-pause", "--projector", "roster", "--reason", "r", "--json", dsn=dsn
    )
    found["projector-pauses"] = run_json("projector-pauses", "--json", dsn=dsn)
    found["projector-resume"] = run_json(
        "projector-resume", "--projector", "roster", "--json", dsn=dsn
    )
    found["projectors"] = run_json("projectors", "--json", dsn=dsn)  # the drains recorded them
    found["projector-redefine"] = run_json(  # as recorded already: nothing changes
        "projector-redefine", "roster", "--app", APP, "--reason", "r", "--json", dsn=dsn
    )
    found["projector-promote"] = run_json(  # version 1, live already: nothing changes
        "projector-promote", "roster", "--version", "1", "--json", dsn=dsn
    )
    found["projector-retire"] = run_json(
        "projector-retire", "--projector", "roster", "--reason", "r", "--json", dsn=dsn
    )
    return found


@pytest.mark.slow
async def test_every_json_command_keeps_its_keys(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await seed(pool, settings)
    found = {name: key_paths(body) for name, body in outputs(dsn).items()}
    # The seed leaves no list empty where a command lists rows.
    assert "summary.workers[].counters.applied" in found["outbox-report"]
    assert "summary.leases[].lease_owner" in found["outbox-report"]
    assert "summary.parked_rows[].last_error" in found["outbox-report (park)"]
    assert "rows[].event_type" in found["outbox-requeue-dead"]
    assert "groups[].fingerprint" in found["outbox-failures"]
    assert "pauses[].paused_by" in found["projector-pauses"]
    assert "summary.projectors[].other_definitions" in found["outbox-report"]
    if os.environ.get("OUTBOX_PIN_JSON") == "write":
        PINNED.write_bytes(orjson.dumps(found, option=orjson.OPT_INDENT_2) + b"\n")
    assert found == orjson.loads(PINNED.read_bytes())
