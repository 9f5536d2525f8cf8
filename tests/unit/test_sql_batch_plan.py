"""Which workers try their batches in one call (`outbox.worker.sql_batch`): those whose every
projector is a transactional SQL projector; the plan names each one's function, types and
guard, and the ignored types."""

from __future__ import annotations

from outbox import Outbox, Settings, StoredEvent, db
from outbox.worker.sql_batch import OneCall

SETTINGS = Settings(dsn="postgresql://localhost/unused")


def all_sql() -> Outbox:
    app = Outbox(SETTINGS)
    app.sql_projector("roster", events=["joined", "left"], function="App.Apply_Roster")
    app.sql_projector(
        "seen", events=["joined"], function="app.seen", ordered=False, idempotent=True
    )
    app.sql_projector("tally", events=["joined"], function="tally", ordered=False, start="now")
    app.ignore(["renamed"])
    return app


def test_a_registry_of_sql_projectors_has_a_plan() -> None:
    plan = OneCall.of(all_sql().registry)
    assert plan is not None
    assert plan.ignored == ("renamed",)
    assert [
        (p["name"], p["function"], p["types"], p["ordered"], p["markers"]) for p in plan.projectors
    ] == [
        ("roster", "app.apply_roster(jsonb)", ["joined", "left"], True, False),
        ("seen", "app.seen(jsonb)", ["joined"], False, True),
        ("tally", "tally(jsonb)", ["joined"], False, False),
    ]


def test_a_python_or_lease_projector_among_them_has_none() -> None:
    mixed = all_sql()

    @mixed.projector("audit", events=["joined"])
    async def audit(tx: db.Connection, event: StoredEvent) -> None: ...

    assert OneCall.of(mixed.registry) is None
    leased = all_sql()

    @leased.projector("mail", events=["joined"], transactional=False)
    async def mail(pool: db.Pool, event: StoredEvent) -> None: ...

    assert OneCall.of(leased.registry) is None
    assert OneCall.of(Outbox(SETTINGS).registry) is None  # no projector at all
