"""The fault tier's parts: real worker processes, a generator that is its own oracle, a tally.

- `Fleet` runs `outbox-worker` subprocesses, kills and restarts them on purpose, and counts
  every exit it did not cause (an unplanned exit), and every stderr line that is not a JSON
  object with an `event` (a stray line).
- `Generator` appends through the public API with idempotency keys, retrying an append whose
  outcome is unknown with the same key; it records each logical event (uid, per-campaign
  index) once the append is known to have happened. That record is the oracle.
- `Tally` reads what the `witness` projector applied and compares it with the generator:
  lost, applied twice, per-campaign order violations.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from faults_app import SCHEMA

from helpers import ROOT
from outbox import AppendOutcomeUnknown, Event, Settings, append, db

HERE = Path(__file__).resolve().parent
# The summary lines of the scenarios run, printed at the end by the tier's conftest.
SUMMARY: list[str] = []


def code_path(code: Path) -> dict[str, str]:
    """The environment that runs `code`'s package: another checkout's (an upgrade's previous
    release) first on the path, before the one installed from here; nothing for this one."""
    return {} if code == ROOT else {"PYTHONPATH": str(code)}


@dataclass
class Fleet:
    """Worker processes of one scenario; logs in `logs`."""

    dsn: str
    logs: Path
    env: dict[str, str] = field(default_factory=dict)
    app: str = "faults_app:app"
    code: Path = ROOT  # the checkout whose worker starts: another release's (an upgrade's)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_of: dict[str, Path] = field(default_factory=dict)
    unplanned: list[str] = field(default_factory=list)
    started: int = 0
    # Workers that serve a worker group of their own (S35): name -> (app, group), whatever
    # `app` says, at every start and restart.
    groups: dict[str, tuple[str, str]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> None:
        self.started += 1
        self.log_of[name] = self.logs / f"{name}-{self.started}.log"
        log = self.log_of[name].open("wb")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        environ |= {"OUTBOX_DSN": self.dsn, "OUTBOX_LOG_LEVEL": "info", **self.env}
        environ |= code_path(self.code)
        worker = [sys.executable, str(self.code / "cmd" / "outbox-worker.py")]
        app, group = self.groups.get(name, (self.app, None))
        serves = ("--group", group) if group is not None else ()
        self.procs[name] = subprocess.Popen(
            [*worker, "--app", app, *args, *serves],
            cwd=HERE,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()

    def check(self) -> None:
        """Count (and replace) workers that ended without being told to."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                self.unplanned.append(f"{name} exited {code}")
                self.start(name)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def kill_all(self) -> None:
        """Kill whatever still runs: a scenario that failed before `stop()` leaves none behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def signal(self, name: str, signum: signal.Signals) -> None:
        self.procs[name].send_signal(signum)

    async def stop(self) -> None:
        """SIGTERM every worker once it serves; anything but exit 0 is unplanned."""
        self.check()
        for name in self.procs:
            await self._serving(name)
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name in self.procs:
            await self._ended(name)
        self.procs.clear()

    async def stop_one(self, name: str) -> None:
        """SIGTERM one worker once it serves (a rolling restart's step); exit 0 or unplanned."""
        self.check()
        await self._serving(name)
        self.procs[name].send_signal(signal.SIGTERM)
        await self._ended(name)
        del self.procs[name]

    async def _serving(self, name: str) -> None:
        # A worker restarted a moment ago may still be importing; stop it once it serves, so
        # its exit code says how the service shuts down.
        with anyio.fail_after(60):
            while b"worker.registered" not in self.log_of[name].read_bytes():  # noqa: ASYNC110
                await anyio.sleep(0.05)

    async def _ended(self, name: str) -> None:
        proc = self.procs[name]
        with anyio.fail_after(90):
            while proc.poll() is None:  # noqa: ASYNC110 - a child process, polled
                await anyio.sleep(0.05)
        if proc.returncode != 0:
            self.unplanned.append(f"{name} exited {proc.returncode} on SIGTERM")

    def log_lines(self) -> list[dict[str, object] | str]:
        """Every stderr line of every worker: a JSON object, or the raw line when it is not."""
        lines: list[dict[str, object] | str] = []
        for path in sorted(self.logs.glob("*.log")):
            for raw in path.read_text(errors="replace").splitlines():
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    lines.append(raw)
                    continue
                lines.append(parsed if isinstance(parsed, dict) and "event" in parsed else raw)
        return lines

    def stray_lines(self) -> list[str]:
        return [line for line in self.log_lines() if isinstance(line, str)]

    def events(self, name: str) -> int:
        return sum(1 for ln in self.log_lines() if isinstance(ln, dict) and ln["event"] == name)


@dataclass
class Generator:
    """Campaign writers appending `step` events; `expected` is the oracle (uids in order)."""

    pool: db.Pool
    settings: Settings
    campaigns: list[str]
    per_append: int = 3
    pause: float = 0.05
    key_prefix: str = ""  # a second generator over the same campaigns: keys of its own
    expected: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    unknown_outcomes: int = 0
    stopping: anyio.Event = field(default_factory=anyio.Event)

    async def run(self, *, appends: int | None = None) -> None:
        """Append until `stop()` (or `appends` per campaign), one writer per campaign."""
        async with anyio.create_task_group() as tg:
            for campaign in self.campaigns:
                tg.start_soon(self._writer, campaign, appends)

    def stop(self) -> None:
        self.stopping.set()

    @property
    def events(self) -> int:
        return sum(len(v) for v in self.expected.values())

    async def _writer(self, campaign: str, appends: int | None) -> None:
        n = 0
        rng = random.Random(campaign)
        while not self.stopping.is_set() and (appends is None or n < appends):
            n += 1
            key = f"{self.key_prefix}{campaign}-{n}"
            first = len(self.expected[campaign])
            uids = [uuid.uuid4().hex for _ in range(self.per_append)]
            events = [Event("step", {"uid": uid, "i": first + j}) for j, uid in enumerate(uids)]
            await self._append_once(campaign, events, key)
            self.expected[campaign] += uids
            await anyio.sleep(self.pause * (0.5 + rng.random()))

    async def _append_once(self, campaign: str, events: list[Event], key: str) -> None:
        """Until it is known to have happened: an unknown outcome is retried with its key."""
        with anyio.fail_after(120):
            while True:
                try:
                    await append(
                        self.pool, campaign, events, idempotency_key=key, settings=self.settings
                    )
                    return
                except AppendOutcomeUnknown:
                    self.unknown_outcomes += 1
                    await anyio.sleep(0.1)


@dataclass
class Tally:
    scenario: str
    events: int
    faults: int
    lost: int
    applied_twice: int
    order_violations: int
    unplanned_exits: int
    stray_lines: int
    notes: str = ""

    def line(self) -> str:
        text = (
            f"{self.scenario}: events={self.events} faults={self.faults} lost={self.lost} "
            f"applied_twice={self.applied_twice} order_violations={self.order_violations} "
            f"unplanned_exits={self.unplanned_exits} stray_log_lines={self.stray_lines}"
        )
        return f"{text} ({self.notes})" if self.notes else text

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.applied_twice
            or self.order_violations
            or self.unplanned_exits
            or self.stray_lines
        )


def record(result: Tally) -> None:
    """Keep the scenario's summary line (printed at the end, and with -s as it happens)."""
    SUMMARY.append(result.line())
    print(result.line(), flush=True)


async def wait_drained(pool: db.Pool, *, waiting: str = "", within: float = 180) -> None:
    """Until no claimable or leased row is left (the fleet still running), but in campaigns
    LIKE `waiting` (rows meant to wait behind a dead head)."""
    with anyio.fail_after(within):
        while await pool.fetchval(  # noqa: ASYNC110 - database state, polled
            "SELECT count(*) FROM outbox.projection_apply_outbox "
            "WHERE status IN ('pending', 'failed', 'processing') "
            "AND NOT ($1 <> '' AND campaign_id LIKE $1)",
            waiting,
        ):
            await anyio.sleep(0.1)


async def tally(
    scenario: str,
    pool: db.Pool,
    expected: dict[str, list[str]],
    fleet: Fleet,
    *,
    faults: int,
    notes: str = "",
    projector: str | None = None,
) -> Tally:
    """Compare what the witness (or `projector`, of `faults_app.tracks_app`) applied with the
    generator's record."""
    rows = (
        await pool.fetch("SELECT campaign_id, uid, i FROM fault_applied ORDER BY id")
        if projector is None
        else await pool.fetch(
            "SELECT campaign_id, uid, i FROM fault_tracked WHERE projector = $1 ORDER BY id",
            projector,
        )
    )
    seen = Counter(r["uid"] for r in rows)
    wanted = {uid for uids in expected.values() for uid in uids}
    lost = sum(1 for uid in wanted if seen[uid] == 0)
    twice = sum(n - 1 for n in seen.values() if n > 1)
    violations = 0
    last: dict[str, int] = {}
    for r in rows:
        if r["i"] <= last.get(r["campaign_id"], -1):
            violations += 1
        last[r["campaign_id"]] = r["i"]
    return Tally(
        scenario,
        events=len(wanted),
        faults=faults,
        lost=lost,
        applied_twice=twice,
        order_violations=violations,
        unplanned_exits=len(fleet.unplanned),
        stray_lines=len(fleet.stray_lines()),
        notes=notes,
    )


# -- What the scenarios share ---------------------------------------------------------------

SCALE = float(os.environ.get("FAULTS_SCALE", "1"))
FAST = {"OUTBOX_POLL_INTERVAL": "0.2", "OUTBOX_BATCH_SIZE": "10"}


def scaled(n: int) -> int:
    return max(1, round(n * SCALE))


async def kill_at_random(
    fleet: Fleet, names: Sequence[str], rng: random.Random, kills: int, *, pace: float = 0.2
) -> None:
    """`kills` SIGKILLs of workers `names` chosen at random, each restarted at once (2 loops),
    one every `pace` to three times `pace` seconds."""
    for _ in range(kills):
        await anyio.sleep(pace + rng.random() * 2 * pace)  # fault pacing
        worker = rng.choice(list(names))
        fleet.kill(worker)
        fleet.start(worker, "--concurrency", "2")
        fleet.check()


def campaigns(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(n)]


def two_workers_under_load(
    fleet: Fleet, pool: db.Pool, dsn: str, prefix: str, n: int, *, pause: float
) -> Generator:
    """Start w1 and w2 (concurrency 2, FAST) and return a keyed generator over `n` campaigns
    named `prefix`-NN, not yet running."""
    fleet.env |= FAST
    for name in ("w1", "w2"):
        fleet.start(name, "--concurrency", "2")
    return Generator(pool, Settings(dsn=dsn), campaigns(prefix, n), pause=pause)


async def finish(
    name: str,
    pool: db.Pool,
    fleet: Fleet,
    generator: Generator,
    *,
    faults: int,
    notes: str = "",
    waiting: str = "",
    projectors: Sequence[str] = (),
) -> None:
    fleet.check()
    await wait_drained(pool, waiting=waiting)
    await fleet.stop()
    results = [await tally(name, pool, generator.expected, fleet, faults=faults, notes=notes)]
    for projector in projectors:  # each projector on its own track: a line each (S24)
        results.append(
            await tally(
                f"{name}[{projector}]",
                pool,
                generator.expected,
                fleet,
                faults=faults,
                notes=notes,
                projector=projector,
            )
        )
    for result in results:
        record(result)
    for result in results:
        assert result.clean, result.line() + f" unplanned={fleet.unplanned[:3]}"
    # A campaign has at most one campaign row, in whichever slot (S26).
    doubled = await pool.fetch(
        "SELECT campaign_id FROM outbox.projection_apply_campaigns "
        "GROUP BY bucket, campaign_id HAVING count(*) > 1"
    )
    assert not doubled, f"campaigns with two campaign rows: {[r[0] for r in doubled][:5]}"


# The fixtures of the tiers that run scenarios (tests/faults, tests/citus): their conftests
# import them.
@pytest.fixture
async def witness_table(pool: db.Pool) -> None:
    """The tables the scenario apps' projectors write (`faults_app.SCHEMA`)."""
    await pool.execute(SCHEMA)


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(dsn, tmp_path)
    yield fleet
    fleet.kill_all()  # a scenario that failed midway stopped none of its workers
