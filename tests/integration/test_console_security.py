"""The console's security model against a real server, probed as an attacker would: the
headers on every route, authentication on every route in both modes, framing refused, the
Origin check and per-session CSRF, failed logins throttled, a database outage on every route,
the dry run under the console's session, bad parameters, bidirectional text and the access
log (docs/console.md, "Safety model")."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import pytest
from factories import make_dead

from outbox import Event, Settings, append, db
from outbox.console import create_app
from outbox.console.guard import HEADERS
from outbox.console.security import Throttle, basic_auth
from outbox.console.state import MAX_TEXT, hide_payload

USER, PASSWORD = "ops", "s3cret"
# Every GET route: the pages, their JSON twins, the fragments and a static file.
PAGES = [
    "/",
    "/failures",
    "/failures/requeue",
    "/rows",
    "/blocked",
    "/projectors",
    "/workers",
    "/system",
]
TWINS = ["/api/overview"] + [f"/api{p}" for p in PAGES[1:]]
ROUTES = [
    *PAGES,
    "/campaign?id=c1",
    *TWINS,
    "/api/campaign?id=c1",
    "/row?campaign_id=c1&seq=1",
    "/api/row?campaign_id=c1&seq=1",
    "/fragments/overview",
    "/fragments/live",
]
CONTROLS = [
    "/actions/requeue",
    "/actions/retry",
    "/actions/discard",
    "/actions/pause",
    "/actions/resume",
]
BROWSER = {"sec-fetch-site": "same-origin"}  # what a browser sends from the console's pages


def login(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def client(app: object, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(
        transport=transport, base_url="http://console", headers=headers, follow_redirects=True
    )


def csrf_of(html: str) -> str:
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


@pytest.fixture
async def seeded(pool: db.Pool, settings: Settings) -> db.Pool:
    await append(pool, "c1", [Event("t", {"email": "ann@example.com"})] * 2, settings=settings)
    await make_dead(pool, "c1", 1)
    return pool


async def test_every_response_carries_the_security_headers(seeded: db.Pool) -> None:
    async with client(create_app(seeded, actions=True, auth=basic_auth(USER, PASSWORD))) as c:
        answers = [await c.get(path) for path in [*ROUTES, "/static/console.css", "/nope"]]
        answers.append(await c.post("/actions/requeue", data={}))  # 401 before anything
        c.headers.update(login())
        answers += [await c.get(path) for path in [*ROUTES, "/static/console.css", "/nope"]]
        answers.append(await c.post("/actions/requeue", data={}, headers={"origin": "http://x"}))
    statuses = {a.status_code for a in answers}
    assert {200, 401, 403, 404} <= statuses
    for answer in answers:
        where = (answer.request.method, answer.request.url.path, answer.status_code)
        for name, value in HEADERS.items():
            assert answer.headers.get(name) == value, where
        static = answer.request.url.path.startswith("/static/")
        assert (answer.headers.get("cache-control") == "no-store") is not static, where
    csp = HEADERS["content-security-policy"]
    assert "frame-ancestors 'none'" in csp  # framing refused
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert HEADERS["x-frame-options"] == "DENY"


@pytest.mark.parametrize("actions", [False, True])
async def test_authentication_guards_every_route_in_both_modes(
    seeded: db.Pool, actions: bool
) -> None:
    app = create_app(seeded, actions=actions, auth=basic_auth(USER, PASSWORD))
    async with client(app) as anonymous:
        for path in ROUTES:
            refused = await anonymous.get(path)
            assert refused.status_code == 401, path
            assert "ann@example.com" not in refused.text
        for path in CONTROLS:
            assert (await anonymous.post(path, data={})).status_code == 401, path
    async with client(app, **login()) as operator:
        for path in ROUTES:
            assert (await operator.get(path)).status_code == 200, path


async def test_credentials_in_the_environment_guard_a_read_only_console(
    seeded: db.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_CONSOLE_USER", USER)
    monkeypatch.setenv("OUTBOX_CONSOLE_PASSWORD", PASSWORD)
    async with client(create_app(seeded)) as console:
        assert (await console.get("/api/campaign", params={"id": "c1"})).status_code == 401
        answer = await console.get("/api/campaign", params={"id": "c1"}, headers=login())
        assert answer.status_code == 200


async def test_a_post_from_another_origin_is_refused_whatever_it_carries(
    seeded: db.Pool,
) -> None:
    app = create_app(seeded, actions=True, auth=basic_auth(USER, PASSWORD))
    form = {"campaign_id": "c1", "seq": "1", "reason": "fixed"}
    async with client(app, **login()) as operator:
        form["csrf"] = csrf_of((await operator.get("/campaign", params={"id": "c1"})).text)
        forged: list[dict[str, str]] = [
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
            {"origin": "https://attacker.example"},
            {"origin": "null"},  # a sandboxed frame
            {"referer": "https://attacker.example/page"},
        ]
        for headers in forged:
            refused = await operator.post("/actions/requeue", data=form, headers=headers)
            assert refused.status_code == 403, headers
        assert await seeded.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0
        # The console's own page, as a browser sends it (no-referrer: Origin is null, but
        # Sec-Fetch-Site says where it came from).
        own = {"sec-fetch-site": "same-origin", "origin": "null"}
        done = await operator.post("/actions/requeue", data=form, headers=own)
        assert done.status_code == 200, done.text
    assert await seeded.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 1


async def test_a_post_that_names_no_origin_at_all_is_refused(seeded: db.Pool) -> None:
    """A state-changing request with no Sec-Fetch-Site, Origin or Referer cannot be told from a
    forgery (a browser behind a proxy that strips them, a script): refused, nothing written."""
    app = create_app(seeded, actions=True, auth=basic_auth(USER, PASSWORD))
    form = {"campaign_id": "c1", "seq": "1", "reason": "fixed"}
    async with client(app, **login()) as operator:
        form["csrf"] = csrf_of((await operator.get("/campaign", params={"id": "c1"})).text)
        bare = await operator.post("/actions/requeue", data=form)
        assert bare.status_code == 403
        assert bare.text.startswith("request refused: it carries no Sec-Fetch-Site, Origin or")
        assert (
            await operator.post("/actions/requeue", data=form, headers={"origin": ""})
        ).status_code == 403
        assert await seeded.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 0
        # From the console's own page, an older browser: Origin names the console.
        done = await operator.post(
            "/actions/requeue", data=form, headers={"origin": "http://console"}
        )
        assert done.status_code == 200, done.text
    assert await seeded.fetchval("SELECT count(*) FROM outbox.outbox_requeue_audit") == 1


async def test_a_csrf_token_belongs_to_one_browser_session(seeded: db.Pool) -> None:
    app = create_app(seeded, actions=True, auth=basic_auth(USER, PASSWORD))
    form = {"campaign_id": "c1", "seq": "1"}
    async with client(app, **login()) as first, client(app, **login()) as second:
        token = csrf_of((await first.get("/campaign", params={"id": "c1"})).text)
        await second.get("/")  # a session of its own (its cookie)
        stolen = await second.post(
            "/actions/requeue", data={**form, "csrf": token}, headers=BROWSER
        )
        assert stolen.status_code == 403
        assert "csrf" in stolen.text.lower() or "token" in stolen.text.lower(), stolen.text
        mine = await first.post("/actions/requeue", data={**form, "csrf": token}, headers=BROWSER)
        assert mine.is_success
    cookie = stolen.request.headers["cookie"]
    assert cookie.startswith("outbox_console_session=")


async def test_failed_logins_are_throttled_per_client(seeded: db.Pool) -> None:
    now = [1000.0]
    throttle = Throttle(limit=3, window=60.0, clock=lambda: now[0])
    app = create_app(seeded, auth=basic_auth(USER, PASSWORD), throttle=throttle)
    async with client(app) as guesser:
        for _ in range(3):
            wrong = await guesser.get("/api/system", headers=login(password="guess"))
            assert wrong.status_code == 401
        # Past the limit even the right password waits: a guesser learns nothing more.
        held = await guesser.get("/api/system", headers=login())
        assert held.status_code == 429
        assert held.headers["retry-after"] == "60"
        now[0] += 61
        assert (await guesser.get("/api/system", headers=login())).status_code == 200


async def test_every_route_answers_a_database_outage_with_503_and_one_line() -> None:
    pool = await db.create_pool("postgresql://nobody@127.0.0.1:1/none", min_size=0)
    try:
        async with client(create_app(pool, settings=Settings())) as console:
            for path in ROUTES:
                answer = await console.get(path)
                assert answer.status_code == 503, (path, answer.text[:200])
                if path.startswith("/api/"):
                    error = answer.json()["error"]
                    assert "database" in error, path
                    assert "\n" not in error, path
                else:
                    assert "Traceback" not in answer.text
    finally:
        await pool.close()


async def test_the_dry_run_reads_in_the_consoles_session_under_its_timeout(
    seeded: db.Pool,
) -> None:
    """The group preview waits on a lock the test holds: it waits as `outbox-console`, and
    the session's 5 s statement_timeout ends it with a 503, not a request that hangs."""
    async with client(create_app(seeded)) as console, seeded.acquire() as locker:
        seen: dict[str, Any] = {}
        async with locker.transaction():
            await locker.execute(
                "LOCK TABLE outbox.projection_apply_outbox IN ACCESS EXCLUSIVE MODE"
            )
            async with anyio.create_task_group() as tg:

                async def preview() -> None:
                    seen["answer"] = await console.get("/api/failures/requeue")

                tg.start_soon(preview)
                while not seen.get("waiting") and "answer" not in seen:
                    # (Not on `locker`: in a transaction pg_stat_activity is read once.)
                    seen["waiting"] = await seeded.fetchrow(
                        "SELECT application_name FROM pg_stat_activity "
                        "WHERE application_name = 'outbox-console' AND wait_event_type = 'Lock'"
                        "  AND query LIKE '%projection_apply_outbox%'"
                    )
                    await anyio.sleep(0.05)
    answer = seen["answer"]
    assert seen["waiting"], answer.text
    assert answer.status_code == 503
    assert "statement timeout" in answer.json()["error"]


async def test_bad_parameters_get_400_and_change_nothing(seeded: db.Pool) -> None:
    app = create_app(seeded, actions=True, auth=basic_auth(USER, PASSWORD))
    async with client(app, **login()) as operator:
        assert (await operator.get("/campaign", params={"id": "c\x001"})).status_code == 400
        assert (await operator.get("/api/failures", params={"status": "x\x00"})).status_code == 400
        huge = await operator.get("/api/failures/requeue", params={"limit": "9" * 19})
        assert huge.status_code == 400
        assert "expected 1 to 9223372036854775807" in huge.json()["error"]
        assert (await operator.get("/campaign", params={"id": "x" * 3000})).status_code == 400
        token = csrf_of((await operator.get("/campaign", params={"id": "c1"})).text)
        long = {"projector": "p", "reason": "r" * (MAX_TEXT + 1), "csrf": token}
        assert (
            await operator.post("/actions/pause", data=long, headers=BROWSER)
        ).status_code == 400
        body = {"projector": "p", "reason": "r" * 20_000, "csrf": token}
        assert (
            await operator.post("/actions/pause", data=body, headers=BROWSER)
        ).status_code == 413
    assert await seeded.fetchval("SELECT count(*) FROM outbox.outbox_projector_pauses") == 0


async def test_bidirectional_controls_are_shown_escaped(seeded: db.Pool) -> None:
    await seeded.execute(
        "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, concurrency, counters) "
        "VALUES ($1, 'host', 1, 'apply', 1, '{}')",
        "w-\u202egnp.exe",
    )
    async with client(create_app(seeded, refresh=3600)) as console:
        page = (await console.get("/workers")).text
    assert "\u202e" not in page
    assert "w-\\u202egnp.exe" in page


async def test_payloads_can_be_hidden(seeded: db.Pool) -> None:
    async with client(create_app(seeded, redact=hide_payload)) as console:
        page = await console.get("/campaign", params={"id": "c1"})
        twin = await console.get("/api/campaign", params={"id": "c1"})
    assert page.status_code == twin.status_code == 200
    assert "ann@example.com" not in page.text + twin.text
    assert {r["payload"] for r in twin.json()["data"]["rows"]} == {"(hidden)"}


async def test_the_access_log_has_a_line_per_request_and_no_secret(seeded: db.Pool) -> None:
    lines: list[Mapping[str, Any]] = []
    app = create_app(seeded, auth=basic_auth(USER, PASSWORD), access_log=lines.append)
    async with client(app) as console:
        await console.get("/api/system", headers=login())
        await console.get("/api/system", headers=login(password="wrong"))
    assert [(e["path"], e["status"], e["actor"]) for e in lines] == [
        ("/api/system", 200, USER),
        ("/api/system", 401, None),
    ]
    assert PASSWORD not in repr(lines)
    assert "wrong" not in repr(lines)


async def test_links_never_come_from_the_host_header(seeded: db.Pool) -> None:
    app = create_app(seeded, allowed_hosts=["127.0.0.1", "localhost"])
    async with client(app) as console:
        rebound = await console.get("/", headers={"host": "attacker.example"})
        assert rebound.status_code == 400  # not a name this console serves
        page = await console.get("/", headers={"host": "localhost"})
    assert page.status_code == 200
    assert "attacker.example" not in page.text
    assert "http://localhost" not in page.text
    assert 'href="/failures"' in page.text
