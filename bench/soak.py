#!/usr/bin/env python3
"""`make soak`: hours of churn in minutes' worth of code. Does anything grow that should not?

Usage: python bench/soak.py [--minutes N] [--rate EVENTS_PER_S] [--chart soak.png]
                            [--sample SECONDS] [--tracemalloc DIR]
(`make soak SOAK_MINUTES=60`; SOAK_MINUTES defaults to 10.)

On a durable local server (or OUTBOX_BENCH_DSN): a steady keyed append load (`--rate` events/s
over 400 campaigns, 1-4 events an append, an unknown outcome retried with its key), 3
`outbox-worker` processes (concurrency 2) applying an additive projector, and faults: one
worker SIGKILLed and restarted every minute (w2 and w3 in turn: w1 lives the whole run, so its
memory is the one that can leak), a worker backend terminated every 30 s (any worker's), and
`maintenance cleanup` every 2 minutes (append keys live 10 minutes here, so the key table
settles too). Every `--sample` seconds (default: a minute, or a twelfth of a short run) it
records applied events/s, the append latency (p99 and worst), the backlog, the work and
campaign queue tables' heap and index sizes and dead tuples, the append-key table's size, each
worker's RSS and open file descriptors, the server's connections to the database, and the share
of the machine's CPU its host took (steal: on a virtual machine it comes and goes, and a
throughput figure must be read against it).

After a warm-up (a fifth of the run, at least a minute) it asserts:
- w1's RSS grows at most 10% (the mean of the last three samples against the first three);
- w1's file descriptors and the server's connections are flat (the last half's peak at most
  the first half's peak + 2);
- the queue tables (heap + indexes) are bounded (the last half's peak at most 1.5x the first
  half's + 1 MiB): autovacuum keeps up;
- throughput in the last tenth of the run is at least 0.9x the first tenth (each at least a
  minute long: the load catches up after a stall, so a shorter window measures the stall);
- the oracle is all zero at the end: lost, applied twice, order violations, unplanned exits.

It prints the samples as a table, what each table settled at (with the append-key table's
bytes per key and what a day of keys costs at the default 24-hour TTL), writes a PNG chart
(matplotlib) and exits 1 when an assertion fails. `--tracemalloc DIR` makes w1 dump
allocation snapshots every 2 minutes and prints what grew most between the first and last.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from _soak_app import EVENT_TYPE, SCHEMA
from _support import TABLE_SIZES, bench_database, print_json

from outbox import AppendOutcomeUnknown, DatabaseUnavailable, Event, Settings, append

HERE = Path(__file__).resolve().parent
WORKER = [sys.executable, str(HERE.parent / "cmd" / "outbox-worker.py"), "--app", "_soak_app:app"]
MAINTENANCE = [sys.executable, "-m", "outbox", "maintenance"]  # no PATH needed
WORKERS = ("w1", "w2", "w3")
CAMPAIGNS = 400
WRITERS = 8
KEY_TTL = 600  # seconds: the key table settles within the run (the default is a day)
KILL_EVERY, TERMINATE_EVERY, CLEANUP_EVERY = 60.0, 30.0, 120.0
QUEUES = ("projection_apply_outbox", "projection_apply_campaigns")
KEYS = "append_idempotency_keys"
MIB = 1024 * 1024

CONNECTIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
APPLIED = "SELECT coalesce(sum(applied), 0)::bigint FROM soak_applied"
BACKLOG = "SELECT count(*) FROM outbox.projection_apply_outbox"
LIVE_BACKLOG = "SELECT count(*) FROM outbox.projection_apply_outbox WHERE status <> 'dead'"
DEAD = "SELECT count(*) FROM outbox.projection_apply_outbox WHERE status = 'dead'"
TERMINATE_ONE = """
SELECT count(pg_terminate_backend(pid)) FROM (
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = 'outbox-worker'
    ORDER BY random() LIMIT 1) t
"""
ORACLE = "SELECT campaign_id, applied, last_i, repeats, gaps FROM soak_applied"


@dataclass
class Fleet:
    """The worker processes; logs under `logs`; exits nobody asked for are `unplanned`."""

    dsn: str
    logs: Path
    tracemalloc: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    unplanned: list[str] = field(default_factory=list)
    kills: int = 0

    def start(self, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        env |= {"OUTBOX_DSN": self.dsn, "OUTBOX_CONCURRENCY": "2", "OUTBOX_LOG_LEVEL": "info"}
        if self.tracemalloc is not None and name == "w1":
            env["SOAK_TRACEMALLOC"] = str(self.tracemalloc)
        self.starts[name] = self.starts.get(name, 0) + 1
        with (self.logs / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                WORKER, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                self.unplanned.append(f"{name} exited {proc.returncode}")
                self.start(name)

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait()
        self.kills += 1
        self.start(name)

    def serving(self, name: str) -> bool:
        """Every start of `name` got as far as registering (a SIGTERM earlier is no test)."""
        log = (self.logs / f"{name}.log").read_text(errors="replace")
        return log.count('"worker.registered"') >= self.starts[name]

    async def stop(self) -> None:
        """SIGTERM every worker once it serves; anything but exit 0 is unplanned."""
        self.check()
        for name in self.procs:
            waited = 0
            while not self.serving(name) and waited < 600:
                await asyncio.sleep(0.1)
                waited += 1
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            if proc.wait(timeout=90) != 0:
                self.unplanned.append(f"{name} exited {proc.returncode} on SIGTERM")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def process(self, name: str) -> tuple[float, int]:
        """The worker's resident memory (MiB) and open file descriptors, from /proc."""
        pid = self.procs[name].pid
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS"))
            return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):  # restarting right now
            return float("nan"), -1


@dataclass
class Load:
    """Keyed appends at a steady rate; `expected` counts each campaign's acknowledged events
    (the oracle), `appended` all of them."""

    pool: asyncpg.Pool
    rate: float
    expected: dict[str, int] = field(default_factory=dict)
    appended: int = 0
    unknown: int = 0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    latencies: list[float] = field(default_factory=list)  # seconds, since the last sample

    def take_latencies(self) -> tuple[float, float]:
        """The p99 and the worst append latency (ms) since the last call; a retried append
        counts from its first try."""
        taken, self.latencies = sorted(self.latencies), []
        if not taken:
            return float("nan"), float("nan")
        return taken[int(0.99 * (len(taken) - 1))] * 1000, taken[-1] * 1000

    async def writer(self, n: int) -> None:
        rng = random.Random(n)
        mine = [f"soak-{c:04d}" for c in range(n, CAMPAIGNS, WRITERS)]
        settings = Settings(append_key_ttl=KEY_TTL)
        started, sent, appends = time.monotonic(), 0, 0
        while not self.stopping.is_set():
            campaign = rng.choice(mine)
            first = self.expected.get(campaign, 0)
            events = [Event(EVENT_TYPE, {"i": first + j}) for j in range(rng.randint(1, 4))]
            appends += 1
            key = f"w{n}-{appends}"
            began = time.monotonic()
            while True:  # until known: an unknown outcome is retried with its key
                try:
                    await append(
                        self.pool, campaign, events, idempotency_key=key, settings=settings
                    )
                    break
                except (AppendOutcomeUnknown, DatabaseUnavailable):
                    self.unknown += 1
                    await asyncio.sleep(0.1)
            self.latencies.append(time.monotonic() - began)
            self.expected[campaign] = first + len(events)
            self.appended += len(events)
            sent += len(events)
            ahead = sent / (self.rate / WRITERS) - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)


async def sample(admin: asyncpg.Connection, fleet: Fleet, load: Load) -> dict[str, Any]:
    sizes = {r["name"]: r for r in await admin.fetch(TABLE_SIZES, [*QUEUES, KEYS])}
    row: dict[str, Any] = {
        "t": time.monotonic(),
        "applied": await admin.fetchval(APPLIED),
        "appended": load.appended,
        "backlog": await admin.fetchval(BACKLOG),
        "connections": await admin.fetchval(CONNECTIONS),
        "cpu": cpu_times(),
    }
    for name in (*QUEUES, KEYS):
        r = sizes[name]
        row[name] = {"heap": r["heap"], "index": r["idx"], "dead": r["dead"], "live": r["live"]}
    for name in WORKERS:
        row[f"{name}_rss"], row[f"{name}_fds"] = fleet.process(name)
    row["append_p99"], row["append_max"] = load.take_latencies()
    return row


def cpu_times() -> tuple[int, int]:
    """The machine's (steal, total) CPU ticks from /proc/stat: a virtual machine's host may
    take a share of the CPU at any moment, which a throughput figure must be read against."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[7], sum(ticks[:8])  # user nice system idle iowait irq softirq steal


def steal(rows: list[dict[str, Any]]) -> float:
    """The share (%) of the machine's CPU time the host took between the first and last row."""
    (s0, t0), (s1, t1) = rows[0]["cpu"], rows[-1]["cpu"]
    return float(100 * (s1 - s0) / max(t1 - t0, 1))


def queue_bytes(row: dict[str, Any]) -> int:
    return sum(row[q]["heap"] + row[q]["index"] for q in QUEUES)


def rate(rows: list[dict[str, Any]]) -> float:
    applied: int = rows[-1]["applied"] - rows[0]["applied"]
    seconds: float = rows[-1]["t"] - rows[0]["t"]
    return applied / max(seconds, 1e-9)


def judge(samples: list[dict[str, Any]], warm: int, every: float) -> list[str]:
    """Every assertion that failed, as a line."""
    run = samples[warm:]
    failed: list[str] = []
    half = len(run) // 2
    first3 = statistics.fmean(r["w1_rss"] for r in run[:3])
    last3 = statistics.fmean(r["w1_rss"] for r in run[-3:])
    if last3 > 1.10 * first3:
        failed.append(f"w1 RSS grew {last3 / first3:.2f}x ({first3:.1f} -> {last3:.1f} MiB)")
    for what in ("w1_fds", "connections"):
        early, late = max(r[what] for r in run[:half]), max(r[what] for r in run[half:])
        if late > early + 2:
            failed.append(f"{what} not flat: peak {early} then {late}")
    early_q, late_q = max(map(queue_bytes, run[:half])), max(map(queue_bytes, run[half:]))
    if late_q > 1.5 * early_q + MIB:
        failed.append(f"queue tables grew: peak {early_q / MIB:.1f} then {late_q / MIB:.1f} MiB")
    # A tenth of the run, at least a minute: the load catches up after a stall (a checkpoint's
    # fsyncs, the host taking the CPU), so a shorter window measures the stall, not the trend.
    window = min(max(2, len(run) // 10 + 1, math.ceil(60 / every) + 1), len(run) // 2 + 1)
    early, late = run[:window], run[-window:]
    first, last = rate(early), rate(late)
    if last < 0.9 * first:
        failed.append(
            f"throughput fell: {first:.0f} -> {last:.0f} events/s "
            f"(the host took {steal(early):.0f}% then {steal(late):.0f}% of the CPU)"
        )
    return failed


async def oracle(admin: asyncpg.Connection, expected: dict[str, int]) -> dict[str, int]:
    rows = {r["campaign_id"]: r for r in await admin.fetch(ORACLE)}
    lost = twice = order = 0
    for campaign, n in expected.items():
        r = rows.get(campaign)
        once = 0 if r is None else r["applied"] - r["repeats"]
        lost += max(0, n - once)
        if r is not None:
            twice += r["repeats"]
            order += r["gaps"]
    return {"lost": lost, "applied_twice": twice, "order_violations": order}


HEAD = (
    f"{'min':>5} {'ev/s':>6} {'backlog':>7} {'queue KiB':>10} {'campq KiB':>10} "
    f"{'dead q':>7} {'keys MiB':>8} {'w1 MiB':>7} {'w2 MiB':>7} {'w3 MiB':>7} "
    f"{'w1 fds':>6} {'conns':>5} {'app p99':>7} {'app max':>7} {'steal%':>6}"
)


def row_text(prev: dict[str, Any], r: dict[str, Any], start: float) -> str:
    """One sample as a row of the table (printed as it is taken)."""
    q, c, k = (r[n] for n in (*QUEUES, KEYS))
    return (
        f"{(r['t'] - start) / 60:5.1f} {rate([prev, r]):6.0f} {r['backlog']:7d} "
        f"{(q['heap'] + q['index']) / 1024:10.0f} {(c['heap'] + c['index']) / 1024:10.0f} "
        f"{q['dead'] + c['dead']:7d} {(k['heap'] + k['index']) / MIB:8.1f} "
        f"{r['w1_rss']:7.1f} {r['w2_rss']:7.1f} {r['w3_rss']:7.1f} "
        f"{r['w1_fds']:6d} {r['connections']:5d} {r['append_p99']:7.0f} {r['append_max']:7.0f} "
        f"{steal([prev, r]):6.0f}"
    )


def chart(samples: list[dict[str, Any]], start: float, warm: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [(r["t"] - start) / 60 for r in samples[1:]]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    (ax_rate, ax_size), (ax_rss, ax_conn) = axes
    ax_rate.plot(minutes, [rate([p, r]) for p, r in itertools.pairwise(samples)])
    ax_rate.set_title("applied events/s")
    for name in QUEUES:
        ax_size.plot(minutes, [(r[name]["heap"] + r[name]["index"]) / MIB for r in samples[1:]])
    ax_size.plot(minutes, [(r[KEYS]["heap"] + r[KEYS]["index"]) / MIB for r in samples[1:]])
    ax_size.legend(["work queue", "campaign queue", "append keys"], fontsize=8)
    ax_size.set_title("table + index size (MiB)")
    for name in WORKERS:
        ax_rss.plot(minutes, [r[f"{name}_rss"] for r in samples[1:]], label=name)
    ax_rss.legend(["w1 (never killed)", "w2", "w3"], fontsize=8)
    ax_rss.set_title("worker RSS (MiB)")
    ax_conn.plot(minutes, [r["connections"] for r in samples[1:]], label="server connections")
    ax_conn.plot(minutes, [r["w1_fds"] for r in samples[1:]], label="w1 open fds")
    ax_conn.legend(fontsize=8)
    ax_conn.set_title("connections and descriptors")
    for ax in axes.flat:
        ax.axvline((samples[warm]["t"] - start) / 60, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes (dotted: end of warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def grown_memory(directory: Path) -> None:
    """What grew most in w1 between its first and last tracemalloc snapshot."""
    import tracemalloc

    snaps = sorted(directory.glob("*.snap"))
    if len(snaps) < 2:
        print(f"tracemalloc: {len(snaps)} snapshot(s) in {directory}: too few to compare")
        return
    first, last = (tracemalloc.Snapshot.load(str(p)) for p in (snaps[0], snaps[-1]))
    print(f"tracemalloc: {snaps[0].name} -> {snaps[-1].name}, top growth:")
    for stat in last.compare_to(first, "traceback")[:8]:
        print(
            f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  "
            + " <- ".join(str(f) for f in stat.traceback[:3])
        )


async def soak(args: argparse.Namespace) -> int:
    total = args.minutes * 60
    every = args.sample or min(60.0, total / 12)
    async with bench_database() as dsn:
        admin = await asyncpg.connect(dsn)
        await admin.execute(SCHEMA)
        logs = Path(tempfile.mkdtemp(prefix="outbox-soak-"))
        fleet = Fleet(dsn, logs, args.tracemalloc)
        try:
            for name in WORKERS:
                fleet.start(name)
            pool = await asyncpg.create_pool(dsn, min_size=WRITERS, max_size=WRITERS)
            load = Load(pool, args.rate)
            writers = [asyncio.create_task(load.writer(n)) for n in range(WRITERS)]
            start = time.monotonic()
            samples = [await sample(admin, fleet, load)]
            print(HEAD, flush=True)
            terminations = cleanups = 0
            due = {"kill": KILL_EVERY, "terminate": TERMINATE_EVERY, "cleanup": CLEANUP_EVERY}
            next_sample, victim = every, 0
            while (now := time.monotonic() - start) < total:
                await asyncio.sleep(min(1.0, total - now))
                now = time.monotonic() - start
                fleet.check()
                if now >= due["kill"]:
                    fleet.kill(WORKERS[1 + victim % 2])
                    victim, due["kill"] = victim + 1, due["kill"] + KILL_EVERY
                if now >= due["terminate"]:
                    terminations += await admin.fetchval(TERMINATE_ONE)
                    due["terminate"] += TERMINATE_EVERY
                if now >= due["cleanup"]:
                    env = {**os.environ, "OUTBOX_DSN": dsn}
                    done = await asyncio.to_thread(
                        subprocess.run, [*MAINTENANCE, "cleanup"], env=env, capture_output=True
                    )
                    if done.returncode:
                        print(
                            f"soak: cleanup failed: {done.stderr.decode().strip()}", file=sys.stderr
                        )
                        return 1
                    cleanups += 1
                    due["cleanup"] += CLEANUP_EVERY
                if now >= next_sample:
                    samples.append(await sample(admin, fleet, load))
                    print(row_text(samples[-2], samples[-1], start), flush=True)
                    next_sample += every
            load.stopping.set()
            await asyncio.gather(*writers)
            drained_by = time.monotonic() + 300
            while await admin.fetchval(LIVE_BACKLOG) and time.monotonic() < drained_by:
                fleet.check()  # the fleet drains what is left
                await asyncio.sleep(0.5)
            await fleet.stop()
            counts = await oracle(admin, load.expected)
            counts["dead_rows"] = await admin.fetchval(DEAD)
            final = samples[-1]
            await pool.close()
            await admin.close()
        finally:
            fleet.kill_all()  # after a failure or an interrupt: no worker outlives the run
    warm = max(1, min(len(samples) - 4, max(round(len(samples) / 5), round(60 / every))))
    counts["unplanned_exits"] = len(fleet.unplanned)
    faults = {"kills": fleet.kills, "terminations": terminations, "cleanups": cleanups}
    print(
        f"events={load.appended} "
        + " ".join(f"{k}={v}" for k, v in (faults | counts).items())
        + f" unknown_outcomes_retried={load.unknown}"
    )
    for what in fleet.unplanned:
        print(f"unplanned: {what} (logs in {fleet.logs})")
    keys = final[KEYS]
    per_key = (keys["heap"] + keys["index"]) / max(keys["live"], 1)
    appends_per_s = load.appended / total / 2.5  # 1-4 events an append
    settled = {
        name: f"{(final[name]['heap'] + final[name]['index']) / MIB:.1f} MiB"
        for name in (*QUEUES, KEYS)
    }
    print("settled at: " + ", ".join(f"{k} {v}" for k, v in settled.items()))
    print(
        f"append keys: ~{per_key:.0f} bytes a key; at {appends_per_s:.0f} keyed appends/s a day "
        f"of keys (the default TTL) is ~{per_key * appends_per_s * 86_400 / 1024**3:.1f} GiB"
    )
    chart(samples, start, warm, args.chart)
    print(f"chart: {args.chart}")
    if args.tracemalloc is not None:
        grown_memory(args.tracemalloc)
    failed = judge(samples, warm, every) + [f"{k}={v}" for k, v in counts.items() if v]
    print_json("soak", {"minutes": args.minutes, "rate": args.rate, **faults, **counts})
    for line in failed:
        print(f"soak: FAILED: {line}", file=sys.stderr)
    if not failed:
        shutil.rmtree(fleet.logs, ignore_errors=True)
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 10)))
    parser.add_argument("--rate", type=float, default=250.0, help="events appended per second")
    parser.add_argument("--sample", type=float, default=0.0, help="seconds between samples")
    parser.add_argument("--chart", type=Path, default=Path("soak.png"))
    parser.add_argument("--tracemalloc", type=Path, default=None)
    args = parser.parse_args()
    if args.minutes < 1 or args.rate <= 0:
        parser.error("--minutes must be at least 1 and --rate positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    try:
        sys.exit(asyncio.run(soak(args)))
    except KeyboardInterrupt:
        sys.exit("soak: interrupted")


if __name__ == "__main__":
    main()
