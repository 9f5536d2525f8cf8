"""A version built by the catch-up engine under SIGKILLs and a server restart (S29, S30).

`ledger` v1 applies a journal's history through two workers; then v2 is deployed (a rolling
restart onto `faults_app:versions_app`) and built by `maintenance projections-rebuild
--as-version 2`, throttled so that faults land in it, while the generator appends on most
campaigns and both the build and the workers are SIGKILLed at random and restarted, and the
server restarts once. A build that ends for any reason is run again: it goes on from its
checkpoints. Once the appends stop, v2 is promoted (refused while behind). A reader polls
throughout, in one snapshot each: the live version, and each version's count per campaign; a
live v2 with fewer events than v1 on some campaign would be a version exposed behind. The
oracle is the generator's record, checked per version: lost, applied twice, order, all zero.

A rolling deploy that changes a projector (S33): `ledger` v1 runs on two workers; the change
ships as v2 (`faults_app:changed_app`: another kind and another type) and the workers are rolled
one at a time under appends, one by SIGKILL, so that old workers run v1 while new ones run v1
and v2 and catch v2 up from the journal. Mid-roll, a worker with `ledger` v1 changed in place
(`drifted_app`, as a careless deploy would ship it) starts and is refused (exit 2, one line),
writing nothing. v2 is promoted once caught up; every track is checked against the generator.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from harness import FAST, HERE, Fleet, Generator, campaigns, finish, scaled, wait_drained

from helpers import ROOT, wait_for
from outbox import Settings, db
from outbox.testing.localpg import LocalCluster

pytestmark = pytest.mark.timeout(900)
WORKERS = ("w1", "w2")
BUILD = [
    sys.executable,
    str(ROOT / "cmd" / "maintenance.py"),
    "projections-rebuild",
    "--app",
    "faults_app:versions_app",
    "--projector",
    "ledger",
    "--as-version",
    "2",
    "--yes",
    "--json",
    "--max-rate",
    "150",  # events/s: the history takes the build some 15 s, for the faults to land in
]


@dataclass
class Builder:
    """The build's process: started, killed, and run again whenever it ended."""

    env: dict[str, str]
    logs: Path
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    kills: int = 0
    ended: list[int] = field(default_factory=list)  # exit codes of the runs that ended alone

    def start(self) -> None:
        self.runs += 1
        with (self.logs / f"build-{self.runs}.out").open("wb") as out:
            self.proc = subprocess.Popen(
                BUILD, cwd=HERE, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            self.proc.kill()
            self.proc.wait()
            self.kills += 1
        else:
            self.ended.append(code)
        self.start()

    def again(self) -> bool:
        """Run it again if it ended; whether it ended complete (exit 0)."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        self.ended.append(code)
        if code == 0:
            return True
        self.start()
        return False


@dataclass
class Reader:
    """Polls what a reader sees, one snapshot at a time: the live version and each version's
    events per campaign."""

    pool: db.Pool
    snapshots: int = 0
    behind: int = 0
    saw_v2: int = 0
    stopping: anyio.Event = field(default_factory=anyio.Event)

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.read()
            except Exception as exc:
                if not db.transient(exc):
                    raise
                # the server restarting: the next read sees it back
            await anyio.sleep(0.05)  # a reader's pace

    async def read(self) -> None:
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            live = await conn.fetchval("SELECT outbox.outbox_live_version('ledger')")
            rows = await conn.fetch(
                "SELECT campaign_id, projector, count(*) AS n FROM fault_tracked "
                "WHERE projector IN ('ledger', 'ledger@v2') GROUP BY 1, 2"
            )
        self.snapshots += 1
        if live != 2:
            return
        self.saw_v2 += 1
        counts = {(r["campaign_id"], r["projector"]): r["n"] for r in rows}
        for campaign in {c for c, _ in counts}:
            if counts.get((campaign, "ledger@v2"), 0) < counts.get((campaign, "ledger"), 0):
                self.behind += 1


async def test_a_version_built_under_sigkills_and_a_server_restart(
    pool: db.Pool, dsn: str, fleet: Fleet, cluster: LocalCluster, tmp_path: Path
) -> None:
    fleet.env |= FAST
    settings = Settings(dsn=dsn)
    names = campaigns("ver", 12)
    fleet.app = "faults_app:ledger_app"
    for worker in WORKERS:
        fleet.start(worker, "--concurrency", "2")
    generator = Generator(pool, settings, names, pause=0.005)
    await generator.run(appends=60)
    await wait_drained(pool)
    # v2 deployed: the build starts, the workers roll onto the app with both versions.
    builder = Builder({**fleet.env, "OUTBOX_DSN": dsn, "PYTHONPATH": str(ROOT / "tests")}, tmp_path)
    builder.start()
    fleet.app = "faults_app:versions_app"
    for worker in WORKERS:
        fleet.kill(worker)
        fleet.start(worker, "--concurrency", "2")
    live = Generator(pool, settings, names[:8], pause=0.05, key_prefix="live-")
    live.expected = generator.expected
    reader = Reader(pool)
    rng = random.Random(39)
    kills = scaled(16)
    async with anyio.create_task_group() as tg:
        tg.start_soon(live.run)
        tg.start_soon(reader.run)
        for k in range(kills):
            await anyio.sleep(0.3 + rng.random() * 0.6)  # fault pacing
            if k == kills // 2:  # the build running (it was just run again if it had ended)
                await anyio.to_thread.run_sync(cluster.restart)
            elif rng.random() < 0.5:
                builder.kill()
            else:
                worker = rng.choice(WORKERS)
                fleet.kill(worker)
                fleet.start(worker, "--concurrency", "2")
            fleet.check()
            builder.again()
        live.stop()

        async def built() -> bool:
            return builder.again()

        await wait_for(built, within=180)
        await wait_drained(pool)

        async def promoted() -> bool:
            proc = await anyio.run_process(
                [sys.executable, str(ROOT / "cmd" / "maintenance.py"), "projector-promote",
                 "ledger", "--version", "2"],
                env=builder.env, check=False,
            )  # fmt: skip
            return proc.returncode == 0

        await wait_for(promoted, within=120, interval=0.5)

        async def read_as_v2() -> bool:
            return reader.saw_v2 > 3

        await wait_for(read_as_v2)
        reader.stopping.set()
    notes = (
        f"builds run {builder.runs}, killed {builder.kills}, ended {builder.ended}; "
        f"1 server restart; reader snapshots {reader.snapshots}, v2 behind {reader.behind}"
    )
    await finish(
        "version_built",
        pool,
        fleet,
        generator,
        faults=kills,
        projectors=("ledger", "ledger@v2"),
        notes=notes,
    )
    assert reader.behind == 0, notes
    assert builder.kills > 0, notes


async def test_a_changed_projector_rolled_as_v2_and_a_drifted_worker_refused(
    pool: db.Pool, dsn: str, fleet: Fleet, tmp_path: Path
) -> None:
    fleet.env |= FAST
    settings = Settings(dsn=dsn)
    names = campaigns("chg", 10)
    fleet.app = "faults_app:ledger_app"
    for worker in WORKERS:
        fleet.start(worker, "--concurrency", "2")
    generator = Generator(pool, settings, names, pause=0.01)
    await generator.run(appends=30)
    await wait_drained(pool)
    env = {**fleet.env, "OUTBOX_DSN": dsn, "PYTHONPATH": str(ROOT / "tests" / "faults")}
    live = Generator(pool, settings, names, pause=0.05, key_prefix="live-")
    live.expected = generator.expected

    def drifted() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "cmd" / "outbox-worker.py"), "--app",
             "faults_app:drifted_app"],
            cwd=HERE, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    async with anyio.create_task_group() as tg:
        tg.start_soon(live.run)
        # The roll: w1 onto the changed app (old w2 runs v1 beside it), a careless worker
        # refused mid-roll, then w2 killed (its grace period ran out) and started new.
        fleet.app = "faults_app:changed_app"
        await fleet.stop_one("w1")
        fleet.start("w1", "--concurrency", "2")

        async def v2_recorded() -> bool:
            sql = "SELECT count(*) FROM outbox.outbox_projectors WHERE projector = 'ledger@v2'"
            return bool(await pool.fetchval(sql))

        await wait_for(v2_recorded)  # the careless worker comes after the rolled one started
        refused = await anyio.to_thread.run_sync(drifted)
        fleet.check()
        fleet.kill("w2")
        fleet.start("w2", "--concurrency", "2")
        await anyio.sleep(2)  # appends go on under the rolled fleet
        fleet.check()
        live.stop()
    await wait_drained(pool)

    async def promoted() -> bool:
        proc = await anyio.run_process(
            [sys.executable, str(ROOT / "cmd" / "maintenance.py"), "projector-promote",
             "ledger", "--version", "2"],
            env=env, check=False,
        )  # fmt: skip
        return proc.returncode == 0

    await wait_for(promoted, within=120, interval=0.5)
    lines = [x for x in refused.stderr.splitlines() if not x.startswith("{")]
    notes = f"drifted worker exit {refused.returncode}: {lines[-1:]}"
    assert refused.returncode == 2, refused.stderr
    assert len(lines) == 1
    assert "projector 'ledger' differs from its record (ordered" in lines[0]
    assert "ship it as version 3" in lines[0]  # v2 is the changed one, deployed
    await finish(
        "changed_projector_roll",
        pool,
        fleet,
        generator,
        faults=2,
        projectors=("ledger", "ledger@v2"),
        notes=notes,
    )
