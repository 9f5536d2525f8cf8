"""A bad-input sweep of both CLIs, as subprocesses: malformed DSNs (in options and in the
environment) carrying a canary password, bad environment values, oversized arguments.

Every case: the documented exit code, exactly one stderr line of bounded length, no traceback,
the canary never printed, and no row of the database changed.
"""

from __future__ import annotations

import pytest
from factories import make_dead

from helpers import run_cli
from outbox import Event, Settings, append, db

CANARY = "S3cret-CANARY-71"
LONG = "x" * 10_000
# The prefix ("maintenance: error: ") plus the bounded message.
MAX_LINE = 450

MALFORMED_DSNS = [
    f"postgresql:/app:{CANARY}@db/app",  # one slash
    f"postgresql//app:{CANARY}@db/app",  # no colon
    f"postgres:app:{CANARY}@db",
    f"postgresql:/app:{CANARY}/x@db/app",  # a '/' in the password
    f"mysql://app:{CANARY}@db/app",  # another scheme
    f"host=db user=app password={CANARY}",  # keyword form, which asyncpg refuses
    f"host=db password='{CANARY} x'",
    f"{CANARY}",
    f"app:{CANARY}@db:5432/app",
]
BAD_ENV = {
    "OUTBOX_BATCH_SIZE": "abc",
    "OUTBOX_ENABLED": "maybe",
    "OUTBOX_MAX_ATTEMPTS": "0",
    "OUTBOX_POLL_INTERVAL": "nan",
    "OUTBOX_BACKOFF_CAP": "-3",
    "OUTBOX_ORDERING": "random",
    "OUTBOX_DEAD_POLICY": LONG,
    "OUTBOX_STATEMENT_TIMEOUT": "-1",
    "OUTBOX_LOCK_TIMEOUT": "soon",
    "OUTBOX_IDLE_IN_TRANSACTION_TIMEOUT": "1e999",
}
WORKER = ["--app", "campaigns_demo.app:app", "--drain"]


def cases() -> list[tuple[str, list[str], dict[str, str], int]]:
    """(prog, args, extra env, expected exit code); OUTBOX_DSN is the test's unless replaced."""
    found: list[tuple[str, list[str], dict[str, str], int]] = []
    for bad in MALFORMED_DSNS:
        # A DSN that is not a postgresql:// URI is bad usage (2) in an option or in the env.
        found += [
            ("outbox-worker", [*WORKER, "--dsn", bad], {}, 2),
            ("outbox-worker", WORKER, {"OUTBOX_DSN": bad}, 2),
            ("maintenance", ["outbox-report", "--dsn", bad], {}, 2),
            ("maintenance", ["--dsn", bad, "health"], {}, 2),
            ("maintenance", ["outbox-report"], {"OUTBOX_DSN": bad}, 2),
        ]
    # A well-formed scheme with a broken rest fails when connecting: operational (1).
    for bad in [f"postgresql://app:{CANARY}/db", f"postgresql://app:{CANARY}@127.0.0.1:1/db"]:
        found += [
            ("outbox-worker", [*WORKER, "--dsn", bad], {}, 1),
            ("maintenance", ["outbox-report", "--dsn", bad], {}, 1),
            ("maintenance", ["migrate"], {"OUTBOX_DSN": bad}, 1),
        ]
    for name, value in BAD_ENV.items():
        found += [
            ("outbox-worker", WORKER, {name: value}, 2),
            ("maintenance", ["outbox-requeue-dead", "--limit", "5"], {name: value}, 2),
        ]
    found += [
        ("outbox-worker", ["--app", LONG, "--drain"], {}, 2),
        ("outbox-worker", ["--app", f"{LONG}:app", "--drain"], {}, 2),
        ("outbox-worker", [*WORKER, "--batch-size", LONG], {}, 2),
        ("outbox-worker", [*WORKER, "--concurrency", "0"], {}, 2),
        ("outbox-worker", [*WORKER, "--shutdown-timeout", "-1"], {}, 2),
        ("outbox-worker", [*WORKER, "--mode", LONG], {}, 2),
        ("outbox-worker", [*WORKER, f"--{LONG}"], {}, 2),
        ("outbox-worker", [*WORKER, "--log-level", LONG], {}, 2),
        ("maintenance", ["outbox-report", "--limit", LONG], {}, 2),
        ("maintenance", ["outbox-report", "--status", LONG], {}, 2),
        ("maintenance", ["outbox-requeue", "--campaign-id", LONG, "--seq", "x"], {}, 2),
        ("maintenance", ["outbox-requeue", "--campaign-id", LONG, "--seq", "1"], {}, 1),
        ("maintenance", ["outbox-requeue-dead", "--limit", "0"], {}, 2),
        ("maintenance", [LONG], {}, 2),
        (
            "maintenance",
            ["outbox-replay", "--app", LONG, "--campaign-id", "c", "--seq", "1"],
            {},
            2,
        ),
    ]
    return found


async def snapshot(pool: db.Pool) -> list[tuple[object, ...]]:
    rows = await pool.fetch(
        "SELECT 'q', campaign_id, seq, status, attempt_count, last_error FROM "
        "outbox.projection_apply_outbox UNION ALL SELECT 'j', campaign_id, seq, event_type, "
        "0, NULL "
        "FROM outbox.event_journal ORDER BY 1, 2, 3"
    )
    return [tuple(r) for r in rows]


@pytest.mark.slow
async def test_every_bad_input_is_one_bounded_redacted_line_and_changes_nothing(
    pool: db.Pool, dsn: str, settings: Settings
) -> None:
    await append(pool, "c", [Event("dice.cursed", {}), Event("dice.rolled", {"value": 1})])
    await make_dead(pool, "c", 1)
    before = await snapshot(pool)
    problems: list[str] = []
    for prog, args, env, code in cases():
        proc = run_cli(prog, *args, dsn=dsn, env={"OUTBOX_LOG_LEVEL": "info", **env})
        lines = proc.stderr.strip().splitlines()
        shown = f"{prog} {' '.join(a[:40] for a in args)} {sorted(env)}"
        if proc.returncode != code:
            problems.append(f"{shown}: exit {proc.returncode}, expected {code}: {lines[:1]}")
        if len(lines) != 1 or not lines[0].startswith(f"{prog}: error: "):
            problems.append(f"{shown}: stderr is not one error line: {proc.stderr[:300]!r}")
        if len(proc.stderr) > MAX_LINE:
            problems.append(f"{shown}: a {len(proc.stderr)}-character error line")
        if "Traceback" in proc.stderr:
            problems.append(f"{shown}: a traceback")
        if CANARY in proc.stderr or CANARY in proc.stdout:
            problems.append(f"{shown}: the password was printed: {proc.stderr!r}")
    assert not problems, "\n".join(problems)
    assert await snapshot(pool) == before
