"""The console's pages and controls against a real server, through httpx and the ASGI app:
every page and its JSON twin, hostile data rendered inert, the controls refused without
actions, without authentication and without the CSRF token, and audited with the actor."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import httpx
import pytest

from outbox import Event, Settings, db
from outbox.console import create_app
from outbox.console.security import basic_auth
from outbox.errors import ConfigError, PermanentError
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.known import record
from outbox.worker.batch import Worker
from outbox.worker.registration import Registration

HOSTILE = '<script>alert("x")</script>"' + "'" * 3 + "&" + "y" * 10_000
HOSTILE_ID = HOSTILE[:200]  # ids are at most 256 characters
ESCAPED = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
USER, PASSWORD = "ops<b>", "s3cret"
PAGES = [
    "/",
    "/failures",
    "/blocked",
    "/blocked?order=waiting",
    "/projectors",
    "/workers",
    "/system",
]


def shop(dsn: str) -> Outbox:
    """`totals` (ordered) dies on a negative amount, with the hostile text in its error."""
    app = Outbox(Settings(dsn=dsn, max_attempts=1))

    @app.projector("totals", events=["order.placed"])
    async def totals(tx: db.Connection, event: StoredEvent) -> None:
        if event.payload["amount"] < 0:
            raise PermanentError(f"bad amount {event.payload['amount']}: {HOSTILE}")

    return app


def client(app: object) -> httpx.AsyncClient:
    """A browser on the console's pages: its posts say so (Sec-Fetch-Site)."""
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(
        transport=transport,
        base_url="http://console",
        follow_redirects=True,
        headers={"sec-fetch-site": "same-origin"},
    )


def login(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def seeded(pool: db.Pool, dsn: str) -> Outbox:
    """Campaign HOSTILE_ID: seq 1 dead (hostile error and payload), seq 2 waiting behind it in
    the projector's hold;
    campaigns o-1, o-2: one dead row each of the same error group; c-ok applied."""
    app = shop(dsn)
    await app.append(pool, HOSTILE_ID, [Event("order.placed", {"amount": -1, "note": HOSTILE})])
    await app.append(pool, HOSTILE_ID, [Event("order.placed", {"amount": 2})])
    for i in (1, 2):
        await app.append(pool, f"o-{i}", [Event("order.placed", {"amount": -5 - i})])
    await app.append(pool, "c-ok", [Event("order.placed", {"amount": 1})])
    await Worker(app, pool).drain()
    return app


@pytest.fixture
async def app(pool: db.Pool, dsn: str) -> Outbox:
    return await seeded(pool, dsn)


@pytest.fixture
async def operator(pool: db.Pool, app: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    console = create_app(pool, actions=True, auth=basic_auth(USER, PASSWORD), app=app)
    async with client(console) as c:
        c.headers.update(login())
        yield c


def field_of(html: str, name: str) -> str:
    marker = f'name="{name}" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


def csrf_of(html: str) -> str:
    return field_of(html, "csrf")


async def test_every_page_renders_its_data_inert_with_a_json_twin(
    pool: db.Pool, app: Outbox
) -> None:
    async with client(create_app(pool, app=app)) as console:
        for path in [*PAGES, f"/campaign?{urlencode({'id': HOSTILE_ID})}"]:
            page = await console.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert "<script>alert" not in page.text, path
            assert "read-only" in page.text
            assert 'method="post"' not in page.text, path  # no control without actions
        campaign = (await console.get("/campaign", params={"id": HOSTILE_ID})).text
        assert ESCAPED in campaign  # the id, the error and the payload, escaped
        assert "\\u003cscript\\u003e" in campaign or ESCAPED in campaign
        failures = (await console.get("/api/failures")).json()
        assert failures["mode"] == "console-failures"
        groups = failures["data"]["groups"]
        assert [(g["status"], g["projector"], g["rows"]) for g in groups] == [("dead", "totals", 3)]
        blocked = (await console.get("/api/blocked")).json()["data"]
        # A projector's dead letters hold that projector alone (S24): no campaign is blocked.
        assert (blocked["total"], blocked["campaigns"]) == (0, [])
        view = (await console.get("/api/campaign", params={"id": HOSTILE_ID})).json()["data"]
        assert (view["journal_head"], view["checkpoints"]) == (2, {})
        # Seq 2 waits in `totals`'s dead hold on the campaign (its row went).
        assert [(r["seq"], r["status"]) for r in view["rows"]] == [(1, "dead")]
        assert view["rows"][0]["payload"] == {"amount": -1, "note": HOSTILE}
        assert [e["seq"] for e in view["journal_tail"]] == [2, 1]
        ok = (await console.get("/api/campaign", params={"id": "c-ok"})).json()["data"]
        assert (ok["rows"], ok["checkpoints"]) == ([], {"totals": 1})
        system = (await console.get("/api/system")).json()["data"]
        assert {m["state"] for m in system["migrations"]} == {"applied"}
        assert (await console.get("/api/workers")).json()["data"]["leases"] == []
        # Bad input: one clear message, the right status, nothing rendered from it raw.
        missing = await console.get("/api/campaign")
        assert (missing.status_code, missing.json()["error"]) == (400, "id: required")
        bad = await console.get("/blocked", params={"order": HOSTILE})
        assert bad.status_code == 400
        assert "<script>alert" not in bad.text


async def test_controls_are_refused_without_actions_auth_or_csrf(
    pool: db.Pool, app: Outbox, operator: httpx.AsyncClient
) -> None:
    form = {"campaign_id": "o-1", "seq": "1"}
    async with client(create_app(pool, app=app)) as read_only:
        for path in ("/actions/requeue", "/actions/discard", "/actions/requeue-group"):
            assert (await read_only.post(path, data=form)).status_code == 404
    anonymous = operator.build_request("GET", "/")
    anonymous.headers.pop("Authorization")
    assert (await operator.send(anonymous)).status_code == 401
    operator.headers.update(login(password="wrong"))
    assert (await operator.post("/actions/requeue", data=form)).status_code == 401
    operator.headers.update(login())
    for token in (None, "0" * 64):
        sent = {**form, **({"csrf": token} if token else {})}
        refused = await operator.post("/actions/requeue", data=sent)
        assert refused.status_code == 403
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0
    # Another actor's token is not this actor's.
    other = create_app(pool, actions=True, auth=basic_auth("eve", "x"), app=app)
    async with client(other) as eve:
        eve.headers.update(login("eve", "x"))
        token = csrf_of((await operator.get("/campaign", params={"id": "o-1"})).text)
        assert (await eve.post("/actions/requeue", data={**form, "csrf": token})).status_code == 403


def test_actions_without_auth_are_refused_at_start(
    pool: db.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_CONSOLE_USER", raising=False)
    with pytest.raises(ConfigError, match="OUTBOX_CONSOLE_USER"):
        create_app(pool, actions=True)


async def test_requeue_and_discard_one_row_audited_with_the_actor(
    pool: db.Pool, operator: httpx.AsyncClient
) -> None:
    page = (await operator.get("/campaign", params={"id": "o-1"})).text
    assert "actions enabled" in page
    token = csrf_of(page)
    done = await operator.post(
        "/actions/requeue",
        data={"campaign_id": "o-1", "seq": "1", "reason": "fix 12", "csrf": token},
    )
    assert done.status_code == 200, done.text
    assert "requeued o-1 seq 1" in done.text
    assert (
        "maintenance outbox-requeue --campaign-id o-1 --seq 1 --reason &#39;fix 12&#39;"
        in done.text
    )
    again = await operator.post(
        "/actions/requeue", data={"campaign_id": "o-1", "seq": "1", "csrf": token}
    )
    assert again.status_code == 409  # pending now, not dead
    discard = await operator.post(
        "/actions/discard", data={"campaign_id": "o-2", "seq": "1", "reason": "bad", "csrf": token}
    )
    assert discard.status_code == 200, discard.text
    assert "checkpoints moved: totals" in discard.text
    audit = [tuple(r) for r in await pool.fetch(
        "SELECT action, campaign_id, actor, reason FROM outbox.outbox_requeue_audit ORDER BY "
        "audit_id"
    )]  # fmt: skip
    assert audit == [("requeue", "o-1", USER, "fix 12"), ("discard", "o-2", USER, "bad")]
    blank = await operator.post(
        "/actions/discard",
        data={"campaign_id": HOSTILE_ID, "seq": "1", "reason": " ", "csrf": token},
    )
    assert blank.status_code == 400


async def test_an_error_group_is_previewed_then_requeued(
    pool: db.Pool, operator: httpx.AsyncClient
) -> None:
    failures = (await operator.get("/api/failures")).json()["data"]
    fingerprint = failures["groups"][0]["fingerprint"]
    listing = (await operator.get("/failures")).text
    assert f"fingerprint={fingerprint}" in listing
    preview = await operator.get("/failures/requeue", params={"fingerprint": fingerprint})
    assert preview.status_code == 200
    assert "3 dead row(s) as of" in preview.text
    assert f"maintenance outbox-requeue-dead --error {fingerprint} --limit 10000 --dry-run" in (
        preview.text
    )
    # The oldest N dead rows, whatever their error: previewed the same way.
    oldest = await operator.get("/failures/requeue", params={"limit": "2"})
    assert "Requeue the oldest 2 dead rows: dry run" in oldest.text
    assert "2+ dead row(s) as of" in oldest.text
    assert "(counted up to 2)" in oldest.text
    assert "maintenance outbox-requeue-dead --limit 2 --dry-run" in oldest.text
    twin = (await operator.get("/api/failures/requeue", params={"fingerprint": fingerprint})).json()
    rows = [(r["campaign_id"], r["seq"]) for r in twin["data"]["result"]["rows"]]
    assert sorted(rows) == [(HOSTILE_ID, 1), ("o-1", 1), ("o-2", 1)]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM outbox.projection_apply_outbox WHERE status = 'dead'"
        )
        == 3
    )
    done = await operator.post(
        "/actions/requeue-group",
        data={
            "fingerprint": fingerprint,
            "limit": "10000",
            "reason": "fixed",
            "csrf": csrf_of(preview.text),
            "died_by": field_of(preview.text, "died_by"),
        },
    )
    assert done.status_code == 200, done.text
    assert "finished: 3 row(s) requeued" in done.text
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM outbox.projection_apply_outbox WHERE status = 'dead'"
        )
        == 0
    )
    bad = await operator.get("/failures/requeue", params={"fingerprint": "nope"})
    assert bad.status_code == 400
    assert "12 hex digits" in bad.text


async def test_a_projector_is_paused_and_resumed_from_its_page(
    pool: db.Pool, app: Outbox, operator: httpx.AsyncClient
) -> None:
    page = await operator.get("/projectors")
    assert page.status_code == 200
    assert 'data-projector="totals"' in page.text
    token = csrf_of(page.text)
    paused = await operator.post(
        "/actions/pause", data={"projector": "totals", "reason": HOSTILE[:50], "csrf": token}
    )
    assert paused.status_code == 200, paused.text
    assert "totals: paused" in paused.text
    assert "maintenance projector-pause --projector totals --reason" in paused.text
    twin = (await operator.get("/api/projectors")).json()["data"]
    (row,) = twin["projectors"]
    assert (row["name"], row["pause"]["paused_by"]) == ("totals", USER)
    # Lag from the checkpoints: HOSTILE_ID (2 events) and o-1, o-2 (1 each) are not applied;
    # c-ok is caught up. The oldest unapplied event is HOSTILE_ID's first.
    assert row["outcomes"] == {}
    lag = row["lag"]
    assert (lag["campaigns_behind"], lag["events_behind"]) == (3, 4)
    recorded = await pool.fetchval(
        "SELECT extract(epoch FROM clock_timestamp() - recorded_at) FROM outbox.event_journal "
        "WHERE campaign_id = $1 AND seq = 1",
        HOSTILE_ID,
    )
    assert 0 <= lag["oldest_unapplied_seconds"] <= recorded
    listing = (await operator.get("/projectors")).text
    assert "<script>alert" not in listing
    assert ">resume</button>" in listing
    unknown = await operator.post("/actions/pause", data={"projector": "nope", "csrf": token})
    assert unknown.status_code == 404  # a typo pauses nothing
    resumed = await operator.post("/actions/resume", data={"projector": "totals", "csrf": token})
    assert "totals: resumed" in resumed.text
    assert await pool.fetchval("SELECT count(*) FROM outbox.outbox_projector_pauses") == 0
    history = (await operator.get("/api/projectors")).json()["data"]["history"]
    assert [(e["action"], e["actor"]) for e in history] == [("resume", USER), ("pause", USER)]


async def test_projector_outcomes_add_up_over_the_live_workers(
    pool: db.Pool, app: Outbox, operator: httpx.AsyncClient
) -> None:
    for worker, applied in (("w1", 5), ("w2", 7)):
        await pool.execute(
            "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, concurrency, counters) "
            "VALUES ($1, 'h', 1, 'apply', 1, $2)",
            worker,
            {"applied": applied, "projectors": [
                {"projector": "totals", "applied": applied, "skipped": 1, "failed": 2}
            ]},
        )  # fmt: skip
    (row,) = (await operator.get("/api/projectors")).json()["data"]["projectors"]
    assert row["outcomes"] == {"applied": 12, "skipped": 2, "failed": 4}
    assert 'data-outcome="applied">12<' in (await operator.get("/projectors")).text


async def test_without_the_app_the_projectors_page_lists_every_recorded_one(
    pool: db.Pool, app: Outbox
) -> None:
    """A mixed fleet has no single app: the page lists what the database records, each with
    its definition's fingerprint and whether a live worker runs it (S33)."""
    other = Outbox(Settings(dsn=app.settings.dsn))
    other.sql_projector("ledger", events=["order.placed"], function="app.ledger")
    await record(pool, app.registry, "w-python")
    await record(pool, other.registry, "w-sql")
    fingerprint = await pool.fetchval(
        "SELECT fingerprint FROM outbox.outbox_projectors WHERE projector = 'totals'"
    )
    await Registration(pool, "w-python", "apply", 1, {"totals": fingerprint}).register()
    async with client(create_app(pool)) as console:
        page = (await console.get("/projectors")).text
        rows = (await console.get("/api/projectors")).json()["data"]["projectors"]
    assert [(r["name"], r["fingerprint"] is not None) for r in rows] == [
        ("ledger", True),
        ("totals", True),
    ]
    assert f'data-fingerprint="{fingerprint}"' in page
    assert 'data-attention="unserved"' in page  # `ledger`: no live worker runs it
    assert [r["service"]["workers"] for r in rows] == [0, 1]
