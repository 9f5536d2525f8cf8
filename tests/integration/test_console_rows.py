"""The console's rows and row pages at a size past one page: filters by status, projector,
event type, error group and campaign-id prefix, keyset pages that cover every match once,
the bounded total, and one event in full with its commands."""

from __future__ import annotations

import httpx
from factories import make_dead, make_failed

from outbox import Event, Settings, append, db
from outbox.console import create_app
from outbox.console.reads import LIST_LIMIT
from outbox.console.state import hide_payload

TOTALS_ERROR = "projector 'totals': ValueError: negative amount -3 in order 7"
MAIL_ERROR = "projector 'mailer': TimeoutError: smtp timed out after 30 s"


def client(app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://console")


async def seed(pool: db.Pool, settings: Settings) -> dict[tuple[str, int], str]:
    """130 dead `order.placed` rows of `totals` over 26 `shop-` campaigns, 20 failed
    `mail.sent` rows of `mailer` over 4 `mail-` campaigns; what each row is, by key."""
    made: dict[tuple[str, int], str] = {}
    for n in range(26):
        campaign = f"shop-{n:02d}"
        await append(
            pool, campaign, [Event("order.placed", {"n": i}) for i in range(5)], settings=settings
        )
        await make_dead(pool, campaign, error=TOTALS_ERROR)
        made.update({(campaign, s): "dead" for s in range(1, 6)})
    for n in range(4):
        campaign = f"mail-{n}"
        await append(
            pool, campaign, [Event("mail.sent", {"to": "ann@example.com"})] * 5, settings=settings
        )
        await make_failed(pool, campaign, error=MAIL_ERROR)
        made.update({(campaign, s): "failed" for s in range(1, 6)})
    return made


async def walk(console: httpx.AsyncClient, **filters: str) -> tuple[list[tuple[str, int]], int]:
    """Every page of /api/rows under `filters`: the keys in the order served, and the total."""
    keys: list[tuple[str, int]] = []
    after: str | None = None
    while True:
        params = {**filters, **({"after": after} if after else {})}
        page = (await console.get("/api/rows", params=params)).json()["data"]["page"]
        assert len(page["rows"]) <= LIST_LIMIT
        keys += [(r["campaign_id"], r["seq"]) for r in page["rows"]]
        after = page["after"]
        if after is None:
            return keys, page["total"]


async def test_pages_cover_every_match_once_under_every_filter(
    pool: db.Pool, settings: Settings
) -> None:
    made = await seed(pool, settings)
    async with client(create_app(pool, settings=settings)) as console:
        everything, total = await walk(console)
        assert sorted(everything) == sorted(made)  # every row once, none twice
        assert len(everything) == total == 150
        failed, _ = await walk(console, status="failed")
        assert sorted(failed) == sorted(k for k, s in made.items() if s == "failed")
        dead, total = await walk(console, status="dead", projector="totals")
        assert (len(dead), total) == (130, 130)
        mails, _ = await walk(console, event_type="mail.sent")
        assert {c for c, _ in mails} == {f"mail-{n}" for n in range(4)}
        shop_1x, _ = await walk(console, prefix="shop-1")
        assert sorted(shop_1x) == sorted(k for k in made if k[0].startswith("shop-1"))
        group = (await console.get("/api/failures")).json()["data"]["groups"]
        mailer = next(g["fingerprint"] for g in group if g["projector"] == "mailer")
        by_group, _ = await walk(console, error=mailer)
        assert len(by_group) == 20
        assert (await walk(console, prefix="nobody"))[0] == []
        html = (await console.get("/rows", params={"status": "dead"})).text
        assert f"{LIST_LIMIT} row(s) here of 130 matching" in html
        assert 'rel="next"' in html
        bad = await console.get("/api/rows", params={"after": "junk"})
        assert bad.status_code == 400


async def test_one_event_in_full_with_its_commands(pool: db.Pool, settings: Settings) -> None:
    await seed(pool, settings)
    async with client(create_app(pool, settings=settings)) as console:
        page = await console.get("/row", params={"campaign_id": "mail-2", "seq": "3"})
        assert page.status_code == 200
        assert MAIL_ERROR.replace("'", "&#39;") in page.text
        assert "ann@example.com" in page.text
        twin = (await console.get("/api/row", params={"campaign_id": "mail-2", "seq": "3"})).json()
        event = twin["data"]["view"]["event"]
        assert (event["status"], event["event_type"], event["last_error"]) == (
            "failed",
            "mail.sent",
            MAIL_ERROR,
        )
        assert any("outbox-replay" in c for c in twin["data"]["commands"])
        missing = await console.get("/row", params={"campaign_id": "mail-2", "seq": "99"})
        assert missing.status_code == 404
    async with client(create_app(pool, settings=settings, redact=hide_payload)) as console:
        hidden = await console.get("/row", params={"campaign_id": "mail-2", "seq": "3"})
        assert "ann@example.com" not in hidden.text


async def test_a_campaigns_rows_are_paged_in_seq_order(pool: db.Pool, settings: Settings) -> None:
    await append(
        pool, "big", [Event("t", {"n": i}) for i in range(LIST_LIMIT + 5)], settings=settings
    )
    await make_dead(pool, "big", 3, error=TOTALS_ERROR)
    async with client(create_app(pool, settings=settings)) as console:
        first = (await console.get("/api/campaign", params={"id": "big"})).json()["data"]
        after = first["rows_after"]
        second = (await console.get("/api/campaign", params={"id": "big", "after": after})).json()
        page = (await console.get("/campaign", params={"id": "big"})).text
    seqs = [r["seq"] for r in first["rows"]] + [r["seq"] for r in second["data"]["rows"]]
    assert seqs == list(range(1, LIST_LIMIT + 6))  # every row once, in order
    assert (first["rows_total"], second["data"]["rows_after"]) == (LIST_LIMIT + 5, None)
    assert first["rows"][2]["status"] == "dead"
    assert first["rows"][0]["payload"] == {"n": 0}
    assert page.count("<tr data-seq=") == LIST_LIMIT
    assert f"{LIST_LIMIT} here of {LIST_LIMIT + 5:,}" in page
    assert 'rel="next"' in page


async def test_blocked_campaigns_are_paged_by_head_age(pool: db.Pool, settings: Settings) -> None:
    for n in range(LIST_LIMIT + 30):
        await append(pool, f"b-{n:03d}", [Event("t", {})] * 2, settings=settings)
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox SET status = 'dead', attempt_count = 8, "
        "last_error = 'Boom', "
        # (to_timestamp is immutable: Citus refuses a stable function over a column here.)
        "enqueued_at = to_timestamp(1.7e9 + substr(campaign_id, 3)::int) WHERE seq = 1"
    )
    async with client(create_app(pool, settings=settings)) as console:
        seen: list[str] = []
        after: str | None = None
        while True:
            params = {"after": after} if after else {}
            data = (await console.get("/api/blocked", params=params)).json()["data"]
            assert data["total"] == LIST_LIMIT + 30
            seen += [b["campaign_id"] for b in data["campaigns"]]
            after = data["after"]
            if after is None:
                break
        html = (await console.get("/blocked")).text
        bad = await console.get("/api/blocked", params={"after": "yesterday/x"})
    assert seen == [f"b-{n:03d}" for n in range(LIST_LIMIT + 30)]  # oldest head first, once
    assert 'rel="next"' in html
    assert bad.status_code == 400


async def test_a_campaigns_audit_is_paged_newest_first(pool: db.Pool, settings: Settings) -> None:
    await append(pool, "audited", [Event("t", {})], settings=settings)
    await pool.execute(
        "INSERT INTO outbox.outbox_requeue_audit (campaign_id, seq, actor, reason, "
        "previous_status, previous_attempt_count) "
        "SELECT 'audited', 1, 'ops', 'round ' || n, 'dead', 8 FROM generate_series(1, $1) n",
        LIST_LIMIT + 7,
    )
    async with client(create_app(pool, settings=settings)) as console:
        reasons: list[str] = []
        before: str | None = None
        while True:
            params = {"id": "audited", **({"audit_before": before} if before else {})}
            data = (await console.get("/api/campaign", params=params)).json()["data"]
            reasons += [a["reason"] for a in data["audit"]]
            before = data["audit_before"]
            if before is None:
                break
        bad = await console.get("/campaign", params={"id": "audited", "audit_before": "x/1"})
    assert sorted(reasons) == sorted(f"round {n}" for n in range(1, LIST_LIMIT + 8))
    assert bad.status_code == 400
