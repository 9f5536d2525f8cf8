"""The console in a real browser: Playwright driving Debian's Chromium through an incident.

A worker process runs `worker_apps:shop`, whose `totals` projector raises on negative amounts
until the fix is deployed (a flag in the database). Rows fail and go dead; the console (`maintenance
console --allow-actions`, basic auth) shows the dead count live, the failures page shows the
group, its dry run lists exactly those rows, the fix is deployed, the group is requeued, and
the open page's live counts reach zero without a reload. Every wait is on the page's state or
the database's. The totals are checked against the generator's own sums (exactly once).

Screenshots of the pages go to a temporary directory, or to OUTBOX_CONSOLE_SCREENSHOTS when set
(docs/console.md shows the ones taken with `OUTBOX_CONSOLE_SCREENSHOTS=docs/images/console`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_apps import tally, versioned

from helpers import BIN, SUMS, TESTS, WORKER, sums, wait_for, worker_env
from outbox import Event, Settings, append, db, drain_now, live_version
from outbox.ops.pause import pause_projector
from outbox.projection.app import Outbox

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
USER, PASSWORD = "ops", "incident-pw"
# Chromium as root, headless, on a machine with no outside network (the flags keep it from
# trying one).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The generator's orders: campaign -> amounts (a negative one fails until the fix).
ORDERS = {"acme": [5, -3, 7], "globex": [-4, 2], "initech": [1, 2]}
LIVE_WAIT_MS = 90_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="Debian's chromium is not installed (apt-get install chromium; .ci/run does)",
    ),
]
playwright_api = pytest.importorskip("playwright.async_api")


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    where = os.environ.get("OUTBOX_CONSOLE_SCREENSHOTS")
    path = Path(where) if where else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def worker(dsn: str) -> Iterator[subprocess.Popen[bytes]]:
    env = worker_env(
        dsn,
        OUTBOX_MAX_ATTEMPTS="2",
        OUTBOX_BACKOFF_BASE="0.05",
        OUTBOX_BACKOFF_CAP="0.05",
        OUTBOX_POLL_INTERVAL="0.2",
    )
    proc = subprocess.Popen(
        [*WORKER, "--app", "worker_apps:shop"],
        cwd=TESTS,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # no unplanned exit


@pytest.fixture
def console_url(dsn: str) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(OUTBOX_DSN=dsn, OUTBOX_CONSOLE_USER=USER, OUTBOX_CONSOLE_PASSWORD=PASSWORD)
    proc = subprocess.Popen(
        [str(BIN / "maintenance"), "console", "--port", "0", "--refresh", "0.5", "--allow-actions"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once it listens
        assert "actions enabled" in line, line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def open_console(p: Any) -> tuple[Any, Any, list[str]]:
    """Chromium logged in to the console, a page, and what its CSP refuses (nothing of the
    console's own may be)."""
    browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    context = await browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1280, "height": 800},
    )
    page = await context.new_page()
    refused: list[str] = []
    page.on("console", lambda m: refused.extend([m.text] if "Security Policy" in m.text else []))
    return browser, page, refused


@pytest.fixture
async def shop(pool: db.Pool) -> None:
    await pool.execute(
        "CREATE TABLE shop_flags (fixed boolean NOT NULL);"
        "INSERT INTO shop_flags VALUES (false);"
        "CREATE TABLE shop_totals (campaign_id text PRIMARY KEY, total bigint, orders bigint)"
    )


@pytest.mark.usefixtures("shop")
async def test_an_incident_from_dead_rows_to_zero_in_the_browser(
    pool: db.Pool,
    dsn: str,
    worker: subprocess.Popen[bytes],
    console_url: str,
    screenshots: Path,
) -> None:
    expect = playwright_api.expect
    settings = Settings(dsn=dsn)
    for campaign, amounts in ORDERS.items():
        events = [Event("order.placed", {"amount": a}) for a in amounts]
        await append(pool, campaign, events, settings=settings)
    async with playwright_api.async_playwright() as p:
        browser, page, refused = await open_console(p)
        # 1. The overview, live: two orders go dead (attempts exhausted), one waits behind one
        # in the projector's hold: the projector is held, no campaign is blocked (S24).
        await page.goto(console_url)
        await expect(page.locator('[data-status="dead"]')).to_have_text("2", timeout=LIVE_WAIT_MS)
        await expect(page.locator('[data-figure="blocked"]')).to_have_text("0")
        await expect(page.locator("header .mode")).to_contain_text(f"actions enabled · {USER}")
        await page.screenshot(path=str(screenshots / "overview.png"), full_page=True)
        # 2. The failures page: one group, the projector and the error's shape.
        await page.click("header nav >> text=failures")
        group = page.locator("table.groups tbody tr")
        await expect(group).to_have_count(1)
        await expect(group).to_contain_text("totals")
        await expect(group).to_contain_text("ValueError: negative amount ? in order ?")
        await expect(group.locator("td.num")).to_have_text("2")
        await page.screenshot(path=str(screenshots / "failures.png"), full_page=True)
        # 3. The dry run lists exactly the dead rows, and the command that does the same.
        await group.locator("a.button").click()
        await expect(page.locator("main")).to_contain_text("2 dead row(s) as of")
        rows = page.locator("table.rows tbody tr")
        await expect(rows).to_have_count(2)
        listed = sorted(
            [(await r.locator("td").nth(0).inner_text(), await r.locator("td").nth(1).inner_text())
             for r in await rows.all()]
        )  # fmt: skip
        assert listed == [("acme", "2"), ("globex", "1")]
        await expect(page.locator("code.cli")).to_contain_text("outbox-requeue-dead --error")
        await page.screenshot(path=str(screenshots / "requeue-preview.png"), full_page=True)
        # 4. The fix is deployed; the group is requeued from the page.
        await pool.execute("UPDATE shop_flags SET fixed = true")
        await page.fill("form.confirm input[name=reason]", "negative amounts fixed")
        await page.click("form.confirm button")
        await expect(page.locator('[data-figure="moved"]')).to_contain_text(
            "finished: 2 row(s) requeued"
        )
        # 5. The open page's live counts reach zero without a reload.
        for figure in ("pending", "failed", "dead", "blocked"):
            await expect(page.locator(f'[data-live="{figure}"]')).to_have_text(
                "0", timeout=LIVE_WAIT_MS
            )
        await page.screenshot(path=str(screenshots / "requeued.png"), full_page=True)
        # 6. The campaign page: caught up, and the audit names the actor and the reason.
        await page.fill("header .find input", "acme")
        await page.press("header .find input", "Enter")
        audit = page.locator("table.audit tbody tr")
        await expect(audit).to_have_count(1)
        await expect(audit).to_contain_text(USER)
        await expect(audit).to_contain_text("negative amounts fixed")
        await expect(page.locator("main")).to_contain_text("caught up")
        await page.screenshot(path=str(screenshots / "campaign.png"), full_page=True)
        assert refused == []
        await browser.close()
    # Exactly once, against the generator's own sums.
    totals = {r["campaign_id"]: (r["total"], r["orders"]) for r in await pool.fetch(
        "SELECT campaign_id, total, orders FROM shop_totals"
    )}  # fmt: skip
    assert totals == {c: (sum(abs(a) for a in v), len(v)) for c, v in ORDERS.items()}
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    assert worker.poll() is None  # still serving


# 200k work rows over 2,000 campaigns as an outage leaves them: the first 200 campaigns all
# dead (one error group per projector of three), the next 200 with a failed head, the rest
# pending and not due; every row with its journal event. No worker is alive.
OUTAGE = """
INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, 100 FROM generate_series(0, 1999) c;
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, s, 'order.placed',
       jsonb_build_object('amount', s % 7)
FROM generate_series(0, 1999) c, generate_series(1, 100) s;
INSERT INTO outbox.projection_apply_outbox
    (bucket, campaign_id, seq, event_type, status, attempt_count, next_attempt_at, last_error)
SELECT outbox.outbox_bucket('c-' || c), 'c-' || c, s, 'order.placed',
       CASE WHEN c < 200 THEN 'dead' WHEN c < 400 AND s = 1 THEN 'failed' ELSE 'pending' END,
       CASE WHEN c < 200 THEN 8 WHEN c < 400 AND s = 1 THEN 3 ELSE 0 END,
       clock_timestamp() + interval '1 day',
       CASE WHEN c < 200
                THEN format('projector %L: ValueError: bad amount %s in order %s',
                            'totals_' || (c % 3), -s, c)
            WHEN c < 400 AND s = 1
                THEN 'projector ''mailer'': TimeoutError: smtp timed out after 30 s' END
FROM generate_series(0, 1999) c, generate_series(1, 100) s
"""


async def test_an_outage_at_200k_rows_in_the_browser(
    pool: db.Pool, console_url: str, screenshots: Path
) -> None:
    """The banner says no worker is alive; the rows list, filtered to one error group, pages
    through thousands of dead rows; a row opens in full. No CSP violation on the way."""
    from outbox.queue.settle import refresh_campaigns

    expect = playwright_api.expect
    async with pool.acquire() as conn:
        for statement in OUTAGE.split(";\n"):
            await conn.execute(statement)
        ids = [f"c-{c}" for c in range(2000)]
        await refresh_campaigns(conn, ids, park=False, removable=())
        await conn.execute("ANALYZE")
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 200_000
    async with playwright_api.async_playwright() as p:
        browser, page, refused = await open_console(p)
        await page.goto(console_url)
        banner = page.locator("[data-banner]").first
        await expect(banner).to_contain_text("no worker is alive while 10,000+ rows wait")
        await expect(page.locator("[data-banner]")).to_have_count(2)  # and 200 blocked
        await page.screenshot(path=str(screenshots / "outage-banner.png"), full_page=True)
        # The failures page links each group to its rows; one group's dead rows, paged.
        await page.click("header nav >> text=failures")
        group = page.locator("table.groups tbody tr", has_text="totals_1").first
        await group.locator("text=rows…").click()
        matches = page.locator('[data-figure="matches"]')
        await expect(matches).to_contain_text("100 row(s) here of 6,700 matching")
        first = await page.locator("table.rows tbody tr").first.inner_text()
        await page.click("a[rel=next]")
        await expect(page.locator("table.rows tbody tr")).to_have_count(100)
        assert await page.locator("table.rows tbody tr").first.inner_text() != first
        await expect(page.locator("table.rows tbody")).not_to_contain_text("totals_0")
        await page.screenshot(path=str(screenshots / "rows.png"))
        # A filter by campaign-id prefix, typed into the form.
        await page.fill("form.filters input[name=prefix]", "c-10")
        await page.click("form.filters button")
        await expect(matches).to_contain_text("of 500 matching")  # c-10, c-100, 103, 106, 109
        # One row in full.
        await page.locator("table.rows tbody tr").first.locator("td.num a").click()
        await expect(page.locator('[data-figure="error"]')).to_contain_text(
            "ValueError: bad amount"
        )
        await expect(page.locator("h2", has_text="From a shell")).to_be_visible()
        assert refused == []
        await browser.close()


@pytest.fixture
def versioned_console(dsn: str) -> Iterator[str]:
    """The console given `worker_apps:versioned` (tally in versions 1 and 2), with actions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(
        OUTBOX_DSN=dsn,
        OUTBOX_CONSOLE_USER=USER,
        OUTBOX_CONSOLE_PASSWORD=PASSWORD,
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
    )
    command = [str(BIN / "maintenance"), "console", "--port", "0", "--allow-actions"]
    proc = subprocess.Popen(
        [*command, "--app", "worker_apps:versioned"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "actions enabled" in line, line
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# tally v2 at every campaign's head, its sweep done and no hold of it left.
LEVEL_V2 = """
SELECT (SELECT count(*) FROM outbox.projection_checkpoints k
        JOIN outbox.campaign_heads h USING (bucket, campaign_id)
        WHERE k.projector = 'tally@v2' AND k.applied_seq = h.last_seq) = 12
   AND (SELECT swept_at IS NOT NULL FROM outbox.outbox_projectors WHERE projector = 'tally@v2')
   AND NOT EXISTS (SELECT 1 FROM outbox.projection_holds WHERE projector = 'tally@v2')
"""


@pytest.fixture
async def versioned_history(pool: db.Pool, dsn: str) -> dict[str, int]:
    """Two events on each of 12 campaigns applied by tally v1 alone, and v2 paused before its
    deploy: what each campaign's sum is (the generator's)."""
    await pool.execute(SUMS)
    v1 = Outbox(Settings(dsn=dsn))
    v1.projector("tally", events=["add"], batch=True)(tally)
    expected: dict[str, int] = {}
    for i in range(12):
        amounts = [i + 1, 2 * i + 1]
        await append(pool, f"c{i}", [Event("add", {"n": n}) for n in amounts], settings=v1.settings)
        expected[f"c{i}"] = sum(amounts)
    await drain_now(v1, pool)
    await pause_projector(
        pool, "tally@v2", reason="deployed paused", actor="test", registry=versioned.registry
    )
    return expected


@pytest.fixture
def versioned_worker(dsn: str, versioned_history: dict[str, int]) -> Iterator[None]:
    """A worker with tally v1 and v2 (the deploy), after the history."""
    proc = subprocess.Popen(
        [*WORKER, "--app", "worker_apps:versioned"],
        cwd=TESTS,
        env=worker_env(dsn, OUTBOX_POLL_INTERVAL="0.2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # no unplanned exit


@pytest.mark.usefixtures("versioned_worker")
async def test_a_version_caught_up_and_promoted_in_the_browser(
    pool: db.Pool,
    versioned_history: dict[str, int],
    versioned_console: str,
    screenshots: Path,
) -> None:
    """tally v2 deployed beside v1 while paused: its promotion is refused while it is behind;
    resumed, it catches up; promoted from the page, it is live and v1 is superseded, then
    retired with its guards."""
    expect = playwright_api.expect
    projectors = versioned_console.rstrip("/") + "/projectors"
    recorded = "SELECT count(*) FROM outbox.outbox_projectors WHERE projector = 'tally@v2'"
    await wait_for(lambda: _counts(pool, recorded), within=60)
    async with playwright_api.async_playwright() as p:
        browser, page, refused = await open_console(p)
        await page.goto(projectors)
        v2 = page.locator('tr[data-projector="tally@v2"]')
        await expect(v2.locator(".version")).to_have_text("v2 · building")
        await expect(v2.locator('[data-lag="events"]')).to_have_text("24")
        await page.screenshot(path=str(screenshots / "version-building.png"), full_page=True)
        # Behind: the promotion is refused, saying why, and nothing changes.
        await v2.locator("form.promote button").click()
        await expect(page.locator("main")).to_contain_text("is not caught up")
        assert await live_version(pool, "tally") == 1
        # Resumed from the page, it catches up from the journal.
        await page.goto(projectors)
        await v2.locator("form[action$='/resume'] button").click()
        await wait_for(lambda: _counts(pool, LEVEL_V2), within=60)
        await page.goto(projectors)
        await expect(v2.locator('[data-lag="events"]')).to_have_text("0")
        await v2.locator("form.promote input[name=reason]").fill("v2 counts double")
        await v2.locator("form.promote button").click()
        await expect(page.locator("main")).to_contain_text("tally: version 2 is live")
        await expect(page.locator("code.cli")).to_contain_text(
            "maintenance projector-promote tally --version 2"
        )
        assert await live_version(pool, "tally") == 2
        await page.goto(projectors)
        v1_row = page.locator('tr[data-projector="tally"]')
        await expect(v1_row.locator(".version")).to_have_text("v1 · superseded")
        await expect(v2.locator(".version")).to_have_text("v2 · live")
        await page.screenshot(path=str(screenshots / "version-promoted.png"), full_page=True)
        await v1_row.locator("form.retire input[name=reason]").fill("v2 is live")
        await v1_row.locator("form.retire button").click()
        await expect(page.locator("main")).to_contain_text("tally: retired, 12 checkpoint(s)")
        assert refused == []
        await browser.close()
    assert await sums(pool, "tally@v2") == {c: 2 * n for c, n in versioned_history.items()}
    assert not await _counts(
        pool, "SELECT count(*) FROM outbox.projection_checkpoints WHERE projector = 'tally'"
    )


async def _counts(pool: db.Pool, sql: str) -> bool:
    return bool(await pool.fetchval(sql))
