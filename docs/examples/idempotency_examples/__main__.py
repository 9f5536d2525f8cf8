"""`python -m idempotency_examples [NAME ...]`: run the strategy examples.

Each strategy gets the example stream delivered once, then (after a reset) every message
`--copies` times at once; the table says whether one delivery matches the oracle and whether
the duplicated run matches one delivery. The examples run in a scratch database
`outbox_idempotency_examples`, recreated on OUTBOX_DSN's server (the role needs CREATEDB), or
on the demo's local PostgreSQL under `.outbox/` when OUTBOX_DSN is unset. Exit 1 on a mismatch.
"""

from __future__ import annotations

import os
from typing import Annotated, NoReturn

import typer
from campaigns_demo.demo import fresh_database, local_cluster
from rich.table import Table
from rich.text import Text

from idempotency_examples import Strategy, delivered, messages
from idempotency_examples.catalog import STRATEGIES, by_name
from outbox.cli.common import main as run_main
from outbox.cli.common import run, settings_for, stderr, stdout
from outbox.errors import UsageError
from outbox.obs import log
from outbox.schema import migrate
from outbox.worker.runtime import open_pool

DATABASE = "outbox_idempotency_examples"

app = typer.Typer(name="idempotency-examples", add_completion=False, pretty_exceptions_enable=False)


async def _check(dsn: str, strategies: list[Strategy], copies: int) -> list[tuple[str, bool, bool]]:
    settings = settings_for(dsn=dsn)
    pool = await open_pool(settings, max_size=20)
    stream = messages()
    results = []
    try:
        await migrate(pool)
        for s in strategies:
            await s.install(pool)
            once = await delivered(pool, s, stream, copies=1)
            repeated = await delivered(pool, s, stream, copies=copies)
            results.append((s.name, once == s.expected(stream), repeated == once))
    finally:
        await pool.close()
    return results


@app.command()
def examples(
    names: Annotated[
        list[str] | None, typer.Argument(help="Strategies to run (default: all).")
    ] = None,
    copies: Annotated[
        int, typer.Option(min=2, max=20, help="Concurrent deliveries of every message.")
    ] = 2,
) -> None:
    """Deliver the example stream once and COPIES times at once to each strategy; compare."""
    log.configure(os.environ.get("OUTBOX_LOG_LEVEL", "error"))
    known = by_name()
    unknown = sorted(set(names or ()) - known.keys())
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}; known: {', '.join(known)}")
    chosen = [known[n] for n in names] if names else list(STRATEGIES)
    admin_dsn = settings_for().dsn
    if not admin_dsn:
        stderr.print("OUTBOX_DSN unset: using the local PostgreSQL under .outbox/")
        admin_dsn = local_cluster().start()
    dsn = run(lambda: fresh_database(admin_dsn, DATABASE))
    results = run(lambda: _check(dsn, chosen, copies))
    table = Table(
        "strategy", "one delivery = oracle", f"{copies} at once = one", title="idempotency"
    )
    for name, matches_oracle, matches_once in results:
        table.add_row(name, _yes(matches_oracle), _yes(matches_once))
    stdout.print(table)
    if not all(a and b for _, a, b in results):
        raise typer.Exit(1)


def _yes(ok: bool) -> Text:
    return Text("yes") if ok else Text("NO", style="bold red")


def main() -> NoReturn:
    run_main(app, "idempotency-examples")


if __name__ == "__main__":
    main()
