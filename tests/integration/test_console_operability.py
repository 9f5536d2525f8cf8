"""The console for an operator in an incident: banners on every page, unknown campaigns 404,
post/redirect/get after an action, times relative beside UTC, chart axes."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from factories import make_dead, make_failed

from outbox import Event, Settings, append, db
from outbox.console import create_app
from outbox.console.overview import Alarms
from outbox.console.security import basic_auth
from outbox.console.state import when

USER, PASSWORD = "ops", "pw"


def client(app: object) -> httpx.AsyncClient:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://console",
        headers={"Authorization": f"Basic {token}", "sec-fetch-site": "same-origin"},
    )


def banners(html: str) -> list[str]:
    return [part.split("</p>")[0] for part in html.split("data-banner>")[1:]]


async def test_every_page_raises_the_banners_an_incident_calls_for(
    pool: db.Pool, settings: Settings
) -> None:
    await append(pool, "c1", [Event("t", {})] * 3, settings=settings)
    await append(pool, "c2", [Event("t", {})] * 2, settings=settings)
    await make_dead(pool, "c2", 1)  # c2 blocked behind its dead head
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET enqueued_at = now() - interval '1 hour'"
    )
    quiet = create_app(pool, settings=settings, alarms=Alarms(blocked=5, age=7200))
    async with client(quiet) as console:
        page = (await console.get("/failures")).text
    assert banners(page) == ["no worker is alive while 4 rows wait"]
    loud = create_app(pool, settings=settings, alarms=Alarms(blocked=0, age=60))
    async with client(loud) as console:
        for path in ("/", "/failures", "/blocked", "/workers", "/fragments/live"):
            raised = banners((await console.get(path)).text)
            assert len(raised) == 3, (path, raised)
    assert raised[1].startswith("1 campaigns are blocked")
    assert "the oldest claimable head (c1 seq 1) has waited" in raised[2]
    await pool.execute(
        "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, concurrency, counters) "
        "VALUES ('w1', 'host', 1, 'apply', 1, '{}')"
    )
    async with client(create_app(pool, settings=settings)) as console:
        alive = banners((await console.get("/")).text)  # the worker is back; the head is old
    assert len(alive) == 1
    assert alive[0].startswith("the oldest claimable head (c1 seq 1) has waited 3,6")


async def test_an_unknown_campaign_is_404(pool: db.Pool, settings: Settings) -> None:
    await append(pool, "known", [Event("t", {})], settings=settings)
    async with client(create_app(pool, settings=settings)) as console:
        assert (await console.get("/campaign", params={"id": "known"})).status_code == 200
        typo = await console.get("/campaign", params={"id": "knwon"})
        assert typo.status_code == 404
        assert "no campaign &#39;knwon&#39;" in typo.text
        twin = await console.get("/api/campaign", params={"id": "knwon"})
        assert twin.status_code == 404


async def test_an_action_redirects_so_a_reload_does_not_act_again(
    pool: db.Pool, settings: Settings
) -> None:
    await append(pool, "c1", [Event("t", {})], settings=settings)
    await make_dead(pool, "c1", 1)
    app = create_app(pool, settings=settings, actions=True, auth=basic_auth(USER, PASSWORD))
    async with client(app) as console:
        assert (await console.get("/done")).status_code == 404  # nothing done yet
        page = (await console.get("/campaign", params={"id": "c1"})).text
        marker = 'name="csrf" value="'
        token = page[page.index(marker) + len(marker) :].split('"')[0]
        form = {"campaign_id": "c1", "seq": "1", "reason": "fixed", "csrf": token}
        posted = await console.post("/actions/requeue", data=form)
        assert posted.status_code == 303
        assert posted.headers["location"] == "/done"
        for _ in range(2):  # the page and its reload
            shown = await console.get("/done")
            assert shown.status_code == 200
            assert "requeued c1 seq 1" in shown.text
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 1


async def test_a_failed_row_is_retried_now_from_its_campaign_page(
    pool: db.Pool, settings: Settings
) -> None:
    await append(pool, "c1", [Event("t", {})], settings=settings)
    await make_failed(pool, "c1", 1, attempts=3, due_in=300)  # a 300 s backoff ahead
    app = create_app(pool, settings=settings, actions=True, auth=basic_auth(USER, PASSWORD))
    async with client(app) as console:
        page = (await console.get("/campaign", params={"id": "c1"})).text
        assert ">retry now</button>" in page
        marker = 'name="csrf" value="'
        token = page[page.index(marker) + len(marker) :].split('"')[0]
        form = {"campaign_id": "c1", "seq": "1", "reason": "fixed", "csrf": token}
        posted = await console.post("/actions/retry", data=form)
        assert posted.status_code == 303
        shown = (await console.get("/done")).text
        assert "retried c1 seq 1: due now, its attempts kept" in shown
        assert "maintenance outbox-retry --campaign-id c1 --seq 1 --reason fixed" in shown
        again = await console.post("/actions/retry", data={**form, "seq": "2"})
        assert again.status_code == 404  # no such row: nothing retried
    row = await pool.fetchrow(
        "SELECT status, attempt_count, next_attempt_at <= clock_timestamp() AS due "
        "FROM outbox.projection_apply_outbox"
    )
    assert row is not None
    assert tuple(row) == ("failed", 3, True)
    assert await pool.fetchval("SELECT action FROM outbox.outbox_requeue_audit") == "retry"


def test_times_show_how_long_ago_beside_utc() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert when(now - timedelta(seconds=42), now) == "2026-11-26 11:59:18 UTC (42 s ago)"
    assert when(now - timedelta(minutes=90), now) == "2026-11-26 10:30:00 UTC (1 h ago)"
    assert when(now + timedelta(minutes=3), now) == "2026-11-26 12:03:00 UTC (in 3 min)"
    assert when(now - timedelta(days=3), now).endswith("(3 d ago)")
    assert when(None) == ""


@pytest.mark.usefixtures("settings")
async def test_the_charts_have_axes(pool: db.Pool, settings: Settings) -> None:
    async with client(create_app(pool, settings=settings, refresh=0.5)) as console:
        html = (await console.get("/")).text
    assert html.count('data-axis="top"') == 2
    assert html.count('data-axis="since"') == 2


async def test_a_group_requeue_moves_exactly_what_its_preview_stood_for(
    pool: db.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group larger than one preview's count moves whole, round after round; rows that died
    after the preview stay dead for the next one."""
    monkeypatch.setattr("outbox.console.actions.GROUP_LIMIT", 10)  # 25 rows: three rounds
    error = "projector 'totals': ValueError: negative amount -1"
    for n in range(5):
        await append(pool, f"g-{n}", [Event("t", {})] * 5, settings=settings)
        await make_dead(pool, f"g-{n}", error=error)
    app = create_app(pool, settings=settings, actions=True, auth=basic_auth(USER, PASSWORD))
    async with client(app) as console:
        groups = (await console.get("/api/failures")).json()["data"]["groups"]
        fingerprint = groups[0]["fingerprint"]
        preview = (await console.get("/failures/requeue", params={"fingerprint": fingerprint})).text
        assert "10+ dead row(s) as of" in preview

        def field(name: str) -> str:
            marker = f'name="{name}" value="'
            return preview[preview.index(marker) + len(marker) :].split('"')[0]

        # Three more die after the preview, of the same error.
        await append(pool, "late", [Event("t", {})] * 3, settings=settings)
        await make_dead(pool, "late", error=error)
        await pool.execute(
            "UPDATE outbox.projection_apply_outbox SET updated_at = $1 WHERE campaign_id = 'late'",
            datetime.now(UTC) + timedelta(minutes=1),  # after the preview read
        )
        form = {name: field(name) for name in ("csrf", "fingerprint", "limit", "died_by")}
        posted = await console.post("/actions/requeue-group", data={**form, "reason": "fixed"})
        assert posted.status_code == 303
        done = (await console.get("/done")).text
    assert "finished: 25 row(s) requeued" in done
    left = await pool.fetch(
        "SELECT campaign_id, count(*) AS n FROM outbox.projection_apply_outbox "
        "WHERE status = 'dead' GROUP BY campaign_id"
    )
    assert [(r["campaign_id"], r["n"]) for r in left] == [("late", 3)]
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 25
