"""The web console against a real server: the overview and its JSON twin, the shared poller,
bounded counts, data rendered inert, read-only routes; `maintenance console` serving it."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from factories import make_dead

from helpers import BIN
from outbox import Event, Settings, append, db
from outbox.console import create_app

HOSTILE = '<script>alert("x")</script>' + "'" * 3 + "&" + "y" * 10_000


async def client_for(pool: db.Pool, **options: float) -> httpx.AsyncClient:
    app = create_app(pool, settings=Settings(), **options)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console")


@pytest.fixture
async def console(pool: db.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(pool, refresh=3600) as client:
        yield client


async def seed(pool: db.Pool, settings: Settings) -> None:
    """3 pending rows in c1, a dead head in c2 with one row behind it, a live worker."""
    await append(pool, "c1", [Event("t", {})] * 3, settings=settings)
    await append(pool, "c2", [Event("t", {})] * 2, settings=settings)
    await make_dead(pool, "c2", 1)  # its campaign is blocked behind it
    await pool.execute(
        "INSERT INTO outbox.outbox_workers (worker_id, host, pid, mode, concurrency, counters) "
        "VALUES ($1, 'host', 1, 'apply', 2, '{}')",
        HOSTILE,
    )


async def test_the_overview_and_its_json_twin_show_the_queue(
    pool: db.Pool, settings: Settings, console: httpx.AsyncClient
) -> None:
    await seed(pool, settings)
    body = (await console.get("/api/overview")).json()
    assert (body["schema_version"], body["mode"], body["error"]) == (1, "console-overview", None)
    assert list(body) == ["schema_version", "mode", "data", "error"]  # the twins' envelope
    overview = body["data"]["overview"]
    assert overview["counts"] == {"pending": 4, "processing": 0, "failed": 0, "dead": 1}
    assert overview["bound"] == 10_000
    assert overview["blocked_campaigns"] == 1
    assert overview["oldest_claimable"]["campaign_id"] == "c1"
    assert [w["worker_id"] for w in overview["workers"]] == [HOSTILE]
    page = await console.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'data-status="pending">4<' in html
    assert 'data-status="dead">1<' in html
    assert 'hx-get="/fragments/overview"' in html
    assert 'src="/static/htmx.min.js"' in html
    # Data is inert: escaped, never markup.
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&#39;&#39;&#39;&amp;y" in html
    fragment = await console.get("/fragments/overview")
    assert 'data-status="pending">4<' in fragment.text
    assert "<html" not in fragment.text
    script = await console.get("/static/htmx.min.js")
    assert script.status_code == 200
    assert script.text.startswith("var htmx=")


async def test_one_read_serves_every_page_until_the_figures_are_due(
    pool: db.Pool, settings: Settings, console: httpx.AsyncClient
) -> None:
    """Open pages share one read per refresh interval (here an hour): ten requests, one read,
    and what changed meanwhile shows only at the next read."""
    await append(pool, "c1", [Event("t", {})], settings=settings)
    for path in ["/", "/fragments/overview", "/api/overview"] * 3 + ["/"]:
        assert (await console.get(path)).status_code == 200
    poller = console._transport.app.state.poller  # type: ignore[attr-defined]
    assert poller.reads == 1
    await append(pool, "c2", [Event("t", {})], settings=settings)
    assert (await console.get("/api/overview")).json()["data"]["overview"]["counts"]["pending"] == 1
    poller.interval = 0  # due now
    body = (await console.get("/api/overview")).json()
    assert body["data"]["overview"]["counts"]["pending"] == 2
    assert poller.reads == 2
    # Each read is a sample of the last hour; the overview draws them.
    assert [s["oldest_claimable_age_seconds"] is not None for s in body["data"]["history"]] == [
        True
    ] * 2
    assert 'data-chart="lag"' in (await console.get("/")).text


async def test_counts_stop_at_their_bound(pool: db.Pool, settings: Settings) -> None:
    await append(pool, "c1", [Event("t", {})] * 5, settings=settings)
    async with await client_for(pool, count_bound=3) as console:
        body = (await console.get("/api/overview")).json()
        assert body["data"]["overview"]["counts"]["pending"] == 3
        assert 'data-status="pending">3+<' in (await console.get("/")).text


async def test_the_console_is_read_only(console: httpx.AsyncClient) -> None:
    for path in ("/", "/fragments/overview", "/api/overview"):
        for method in ("POST", "PUT", "DELETE"):
            sent = await console.request(method, path, headers={"sec-fetch-site": "same-origin"})
            assert sent.status_code == 405  # even from its own pages: nothing takes a write


async def test_a_failed_read_keeps_the_last_figures_and_says_why(
    pool: db.Pool, settings: Settings, console: httpx.AsyncClient
) -> None:
    await append(pool, "c1", [Event("t", {})], settings=settings)
    assert (await console.get("/api/overview")).json()["error"] is None
    await pool.execute("ALTER TABLE outbox.outbox_workers RENAME TO outbox_workers_away")
    try:
        poller = console._transport.app.state.poller  # type: ignore[attr-defined]
        poller.interval = 0
        body = (await console.get("/api/overview")).json()
        assert "outbox_workers" in body["error"]
        assert body["data"]["overview"]["counts"]["pending"] == 1  # the last figures
        assert "The last read failed" in (await console.get("/")).text
    finally:
        await pool.execute("ALTER TABLE outbox.outbox_workers_away RENAME TO outbox_workers")


def test_maintenance_console_serves_under_its_base_path(dsn: str) -> None:
    proc = subprocess.Popen(
        [str(BIN / "maintenance"), "console", "--port", "0", "--base-path", "/ops/outbox/"],
        env={"OUTBOX_DSN": dsn, "PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once it listens
        assert line.startswith("console: http://127.0.0.1:"), line
        url = line.split()[1]
        assert url.endswith("/ops/outbox/")
        body = orjson.loads(httpx.get(url + "api/overview", timeout=30).content)
        assert body["mode"] == "console-overview"
        page = httpx.get(url, timeout=30).text
        assert "/ops/outbox/static/htmx.min.js" in page
        outside = url.replace("/ops/outbox/", "/api/overview")
        assert httpx.get(outside, timeout=30).status_code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("trusted", [False, True], ids=["peer", "behind-a-trusted-proxy"])
def test_the_login_throttle_keys_on_the_peer_unless_a_proxy_is_trusted(
    dsn: str, trusted: bool
) -> None:
    """Seven wrong passwords from one peer, each claiming another X-Forwarded-For: the peer is
    throttled (429 past five) and the access log names it, not the claimed addresses, unless
    `--forwarded-allow-ips` names the peer as a proxy: then each address counts on its own."""
    proxies = ["--forwarded-allow-ips", "127.0.0.1"] if trusted else []
    env = {
        "OUTBOX_DSN": dsn,
        "OUTBOX_CONSOLE_USER": "ops",
        "OUTBOX_CONSOLE_PASSWORD": "s3cret",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.Popen(
        [str(BIN / "maintenance"), "console", "--port", "0", *proxies],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = proc.stderr.readline().split()[1]  # printed once it listens
        statuses = [
            httpx.get(
                url + "api/system",
                auth=("ops", "guess"),
                headers={"x-forwarded-for": f"203.0.113.{i}"},
                timeout=30,
            ).status_code
            for i in range(7)
        ]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    clients = {orjson.loads(line)["client"] for line in out.splitlines()}
    if trusted:
        assert statuses == [401] * 7
        assert clients == {f"203.0.113.{i}" for i in range(7)}
    else:
        assert statuses == [401] * 5 + [429] * 2
        assert clients == {"127.0.0.1"}


def test_a_bad_forwarded_allow_ips_is_refused_in_one_line() -> None:
    proc = subprocess.run(
        [str(BIN / "maintenance"), "console", "--forwarded-allow-ips", "10.0.0.1,proxy"],
        env={"OUTBOX_DSN": "postgresql://op:CANARY@127.0.0.1:1/none", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "maintenance: error: --forwarded-allow-ips: 'proxy' is not an address or a network "
        "(expected e.g. 10.0.0.5,10.1.0.0/16 or *)"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "--port"),
        (["--base-path", "ops"], "--base-path"),
        (["--allow-actions"], "OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD"),
        (["--host", "0.0.0.0"], "--insecure-no-auth"),  # noqa: S104 (refused: the point)
    ],
)
def test_maintenance_console_refuses_bad_options_in_one_line(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [str(BIN / "maintenance"), "console", *args],
        env={"OUTBOX_DSN": "postgresql://op:CANARY@127.0.0.1:1/none", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert message in proc.stderr
    assert "CANARY" not in proc.stderr
