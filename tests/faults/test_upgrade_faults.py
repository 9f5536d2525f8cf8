"""A rolling upgrade, as docs/operations.md ("Upgrading") says to run one, from the previous
code to this checkout, under live appenders and workers of both.

The previous code is taken from the repository's history (`git archive PREVIOUS`) and run from
a directory of its own, its package first on the path. Its `maintenance migrate` makes the
database, two of its workers apply `upgrade_app:app` (an unordered and an ordered projector)
and two of its appenders write 3-event keyed appends, each at its campaign's head. Then, with
everything running: this checkout's `maintenance migrate`; one worker rolled (SIGTERM, the new
one started); one appender rolled; old and new run side by side against the new schema; the
other worker rolled by SIGKILL (a deploy whose grace period ran out) and the other appender
rolled. Before the roll, one worker of the previous code is SIGKILLed after the migrate and
started again as the previous code (a host not yet rolled whose supervisor restarts it). The
oracle is what the appenders printed as each append committed: lost, applied
twice and order per projector, all zero, and no process exits unasked.

PREVIOUS is the code this release upgrades from in place. 0.1.0, the only release before this
one, needs a stop (its migration 0004 rewrites the campaign-keyed tables: CHANGELOG, "Upgrading
from 0.1.0", and test_upgrade.py); the rolling guarantee starts with this release. Until the
next release moves PREVIOUS to this one's commit, it is the last code before this release's
newest migrations (issue 38's end: migrations through 0010), so the roll crosses 0011 and 0012
and every server function rewritten since.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from faults_app import SCHEMA
from harness import FAST, HERE, Fleet, Generator, campaigns, code_path, finish

from helpers import ROOT, wait_for
from outbox import Settings, db

pytestmark = pytest.mark.timeout(600)
PREVIOUS = "ed74d2b"  # see the docstring: the next release sets its predecessor's commit here


@pytest.fixture
def _every_scenario_has_the_witness() -> None:
    """This scenario's database is made by the previous code's migrate (`previous_db`)."""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous code, checked out of the repository's history."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the rolling upgrade takes the previous code from git history: no checkout")
    where = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=False
    )
    if archive.returncode != 0:  # a shallow clone: the history is not here
        pytest.skip(f"commit {PREVIOUS} is not in this clone: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where


def maintenance(code: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"OUTBOX_DSN": dsn, "PATH": "/usr/bin:/bin", **code_path(code)}
    return subprocess.run(
        [sys.executable, str(code / "cmd" / "maintenance.py"), *args],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@dataclass
class Appenders:
    """The service's appender processes, each on its own campaigns, of either code."""

    dsn: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    outputs: list[Path] = field(default_factory=list)
    output_of: dict[str, Path] = field(default_factory=dict)  # each one's current output
    unplanned: list[str] = field(default_factory=list)

    def start(self, name: str, code: Path, names: list[str]) -> None:
        out = self.logs / f"appender-{name}-{len(self.outputs)}.jsonl"
        self.outputs.append(out)
        self.output_of[name] = out
        env = {"OUTBOX_DSN": self.dsn, "PATH": "/usr/bin:/bin", **code_path(code)}
        with out.open("wb") as stdout, (self.logs / f"appender-{name}.err").open("ab") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(HERE / "upgrade_app.py"), *names],
                cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
            )  # fmt: skip

    async def stop(self, name: str) -> None:
        """SIGTERM once it appends (its handler is set by then): it finishes the appends under
        way and exits 0."""
        out = self.output_of[name]
        with anyio.fail_after(60):
            while not out.stat().st_size:  # noqa: ASYNC110 - a child process, polled
                await anyio.sleep(0.05)
        proc = self.procs.pop(name)
        if proc.poll() is not None:
            self.unplanned.append(f"appender {name} exited {proc.returncode}")
            return
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(60):
            while proc.poll() is None:  # noqa: ASYNC110 - a child process, polled
                await anyio.sleep(0.05)
        if proc.returncode != 0:
            self.unplanned.append(f"appender {name} exited {proc.returncode} on SIGTERM")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def expected(self) -> dict[str, list[str]]:
        """The oracle: each campaign's uids in the order the appenders committed them."""
        record: dict[str, list[str]] = defaultdict(list)
        for out in self.outputs:
            for line in out.read_text().splitlines():
                appended = json.loads(line)
                record[appended["campaign"]] += appended["uids"]
        return record


async def migrations(pool: db.Pool) -> set[str]:
    return {r[0] for r in await pool.fetch("SELECT name FROM outbox.outbox_schema_migrations")}


async def applied(pool: db.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM fault_tracked"))


async def test_a_rolling_upgrade_from_the_previous_code(
    fresh_db: str, previous: Path, tmp_path: Path
) -> None:
    made = maintenance(previous, fresh_db, "migrate")
    assert made.returncode == 0, made.stderr
    fleet = Fleet(fresh_db, tmp_path, env=dict(FAST), app="upgrade_app:app", code=previous)
    appenders = Appenders(fresh_db, tmp_path)
    names = campaigns("roll", 8)
    halves = {"a": names[:4], "b": names[4:]}
    pool = await db.create_pool(fresh_db, min_size=1, max_size=4)
    try:
        await pool.execute(SCHEMA)
        for worker in ("w1", "w2"):
            fleet.start(worker, "--concurrency", "2")
        for half, owned in halves.items():
            appenders.start(half, previous, owned)

        async def moved_on(by: int) -> None:
            """Until the projectors applied `by` more events (everything keeps running)."""
            floor = await applied(pool) + by

            async def reached() -> bool:
                fleet.check()
                return await applied(pool) >= floor

            await wait_for(reached, within=120)

        await moved_on(150)
        # 1. The schema first, under the previous code's processes.
        before = await migrations(pool)
        upgraded = maintenance(ROOT, fresh_db, "migrate")
        assert upgraded.returncode == 0, upgraded.stderr
        assert await migrations(pool) > before  # the roll crosses a migration
        await moved_on(150)
        # A worker not yet rolled crashes and its supervisor starts the previous code again.
        fleet.kill("w2")
        fleet.start("w2", "--concurrency", "2")
        await moved_on(150)
        # 2. The workers and the appenders rolled one at a time; old and new side by side.
        fleet.code = ROOT
        await fleet.stop_one("w1")
        fleet.start("w1", "--concurrency", "2")
        await appenders.stop("b")
        appenders.start("b", ROOT, halves["b"])
        await moved_on(300)
        fleet.kill("w2")  # a deploy whose grace period ran out
        fleet.start("w2", "--concurrency", "2")
        await appenders.stop("a")
        appenders.start("a", ROOT, halves["a"])
        await moved_on(150)
        for half in halves:
            await appenders.stop(half)
        generator = Generator(pool, Settings(dsn=fresh_db), names)
        generator.expected = appenders.expected()
        fleet.unplanned += appenders.unplanned
        notes = (
            f"from {PREVIOUS}: 2 workers and 2 appenders rolled, 1 worker by SIGKILL; "
            "1 worker of the previous code SIGKILLed and started again after the migrate"
        )
        await finish(
            "rolling_upgrade", pool, fleet, generator, faults=2, notes=notes,
            projectors=("ledger",),
        )  # fmt: skip
    finally:
        await pool.close()
        fleet.kill_all()
        appenders.kill_all()
