"""Every example of docs/append.md runs as written, each on its own stack, against a real
server: your row and its event commit together. The Django example runs in the Django site's
subprocess (test_django.py); the Go examples' statements run here as pgx would send them (no Go
toolchain is needed to check the SQL they rely on); the Node examples run in `node` with the
`pg` that docs/examples/node pins, installed from the npm registry (skipped, saying why, where
the machine has no `node`: .ci/run installs it)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from helpers import ROOT, journal_seqs
from outbox import db

EXAMPLE = re.compile(r"^```(\w+) example=([\w-]+)\n(.*?)^```$", re.M | re.S)
EXAMPLES = {name: code for _, name, code in EXAMPLE.findall((ROOT / "docs/append.md").read_text())}


def url(dsn: str, driver: str) -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


def load(name: str) -> Callable[..., Any]:
    """The example's `place_order`, from the docs' own text."""
    namespace: dict[str, Any] = {}
    exec(compile(EXAMPLES[name], f"docs/append.md:{name}", "exec"), namespace)  # noqa: S102
    place: Callable[..., Any] = namespace["place_order"]
    return place


async def placed(pool: db.Pool, order_id: str) -> bool:
    row = await pool.fetchval("SELECT count(*) FROM orders WHERE id = $1", order_id)
    return bool(row == 1) and await journal_seqs(pool, f"order-{order_id}") == [1]


async def psql(dsn: str, script: str, *flags: str) -> str:
    """`script` run by psql (stopping at its first error, which fails the test); its output."""
    client = shutil.which("psql")
    if client is None:
        pytest.skip("psql is not installed")
    proc = await anyio.run_process(
        [client, dsn, "-v", "ON_ERROR_STOP=1", "-q", *flags, "-f", "-"],
        input=script.encode(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


@pytest.fixture
async def orders(pool: db.Pool) -> None:
    await pool.execute("CREATE TABLE orders (id text PRIMARY KEY)")


def test_the_docs_have_an_example_per_stack() -> None:
    assert set(EXAMPLES) == {
        "asyncpg",
        "sqlalchemy-async",
        "sqlalchemy-sync",
        "psycopg",
        "django",
        "psql",
        "go",
        "node",
        "psql-try",
        "go-try",
        "node-try",
    }


@pytest.mark.usefixtures("orders")
async def test_the_python_examples_run_as_written(pool: db.Pool, dsn: str) -> None:
    """Each twice: the second call, a retry of the same request, answers duplicate and writes
    nothing new."""
    results: dict[str, list[outbox.AppendResult]] = {}
    for _ in range(2):
        results.setdefault("o-asyncpg", []).append(await load("asyncpg")(pool, "o-asyncpg"))

        engine = create_async_engine(url(dsn, "asyncpg"))
        try:
            async with AsyncSession(engine) as session:
                results.setdefault("o-sa-async", []).append(
                    await load("sqlalchemy-async")(session, "o-sa-async")
                )
        finally:
            await engine.dispose()

        def sqlalchemy_sync() -> outbox.AppendResult:
            engine = create_engine(url(dsn, "psycopg"))
            try:
                with Session(engine) as session:
                    placed: outbox.AppendResult = load("sqlalchemy-sync")(session, "o-sa-sync")
                    return placed
            finally:
                engine.dispose()

        def psycopg_sync() -> outbox.AppendResult:
            with psycopg.connect(dsn) as conn:
                placed: outbox.AppendResult = load("psycopg")(conn, "o-psycopg")
                return placed

        results.setdefault("o-sa-sync", []).append(await anyio.to_thread.run_sync(sqlalchemy_sync))
        results.setdefault("o-psycopg", []).append(await anyio.to_thread.run_sync(psycopg_sync))
    for order_id, (first, retry) in results.items():
        assert isinstance(first, outbox.AppendResult)
        assert (first.duplicate, retry.duplicate) == (False, True), order_id
        assert (retry.first_seq, retry.last_seq) == (first.first_seq, first.last_seq)
        assert await placed(pool, order_id), order_id  # one order, one event


@pytest.mark.usefixtures("orders")
async def test_the_psql_example_runs_as_written(pool: db.Pool, dsn: str) -> None:
    for _ in range(2):  # the second: a retry of the same request, which writes nothing new
        await psql(dsn, EXAMPLES["psql"])
        assert await placed(pool, "o-psql")


@pytest.mark.usefixtures("orders")
async def test_the_go_examples_statement_runs_as_pgx_sends_it(pool: db.Pool, dsn: str) -> None:
    code = EXAMPLES["go"]
    call, insert = re.findall(r"`([^`]+)`", code)
    conn = await db.connect(dsn, codecs=False)  # jsonb as text, as pgx sends a Go string
    events = '[{"type":"order.placed","payload":{"id":"o-go"}}]'
    rows = []
    try:
        for _ in range(2):  # the second: a retry of the same request
            async with conn.transaction():
                row = await conn.fetchrow(call, "order-o-go", events, None, "place-o-go")
                assert row is not None
                if not row["duplicate"]:  # as the example does
                    await conn.execute(insert, "o-go")
                rows.append(row)
        with pytest.raises(Exception, match="expected seq 5, head is 1") as refused:
            async with conn.transaction():
                await conn.fetchrow(call, "order-o-go", events, 5, None)
    finally:
        await conn.close()
    first, again = rows
    assert (first["first_seq"], first["last_seq"], first["duplicate"]) == (1, 1, False)
    assert (again["first_seq"], again["duplicate"]) == (1, True)
    assert getattr(refused.value, "sqlstate", None) == "OB002"
    assert await placed(pool, "o-go")


@pytest.mark.usefixtures("orders")
async def test_the_psql_try_example_goes_on_after_a_refusal(pool: db.Pool, dsn: str) -> None:
    refused, appended = (await psql(dsn, EXAMPLES["psql-try"], "-A", "-t")).splitlines()
    assert refused.startswith("expected_seq|0|campaign 'order-o-try': expected seq 7, head is 0")
    assert appended == "1|1|"  # the same transaction went on and appended at the head
    assert await journal_seqs(pool, "order-o-try") == [1]


async def test_the_go_try_examples_statement_goes_on_after_a_refusal(dsn: str) -> None:
    (call,) = re.findall(r"`([^`]+)`", EXAMPLES["go-try"])
    conn = await db.connect(dsn, codecs=False)
    events = '[{"type":"order.placed","payload":{"id":"o-go-try"}}]'
    try:
        async with conn.transaction():
            refused = await conn.fetchrow(call, "order-o-go-try", events, 3, None)
            appended = await conn.fetchrow(call, "order-o-go-try", events, 0, None)
    finally:
        await conn.close()
    assert refused is not None
    assert appended is not None
    assert (refused["refusal"], refused["field"], refused["last_seq"]) == (
        "expected_seq",
        "expected_seq",
        0,
    )
    assert (appended["refusal"], appended["first_seq"]) == (None, 1)


# The Node examples as a service would use them: placeOrder twice (the second a retry), then
# appendAt refused at a stale head and, in the same transaction, appending at the head.
NODE_RUN = """
const { Pool } = require("pg");
const { placeOrder } = require("./place_order");
const { appendAt } = require("./append_at");

(async () => {
  const pool = new Pool({ connectionString: process.env.DATABASE_URL });
  const placed = [await placeOrder(pool, "o-node"), await placeOrder(pool, "o-node")];
  const client = await pool.connect();
  await client.query("BEGIN");
  const events = [{ type: "order.placed", payload: { id: "o-node-try" } }];
  const refused = await appendAt(client, "order-o-node-try", events, 4);
  const appended = await appendAt(client, "order-o-node-try", events, refused.last_seq);
  await client.query("COMMIT");
  client.release();
  let invalid = null;
  try {
    await pool.query("SELECT * FROM outbox.outbox_append($1, $2)", ["", JSON.stringify(events)]);
  } catch (err) {
    invalid = { code: err.code, message: err.message };
  }
  await pool.end();
  console.log(JSON.stringify({ placed, refused, appended, invalid }));
})().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
"""


@pytest.fixture
def node_example(node_project: Path) -> Path:
    """The docs' two Node examples as modules, beside `pg` (node_project)."""
    (node_project / "place_order.js").write_text(EXAMPLES["node"])
    (node_project / "append_at.js").write_text(EXAMPLES["node-try"])
    (node_project / "run.js").write_text(NODE_RUN)
    return node_project


@pytest.mark.usefixtures("orders")
async def test_the_node_examples_run_as_written(
    pool: db.Pool, dsn: str, node_example: Path
) -> None:
    proc = await anyio.run_process(
        ["node", "run.js"], cwd=node_example, env={"DATABASE_URL": dsn, "PATH": "/usr/bin:/bin"},
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    out = orjson.loads(proc.stdout)
    first, retry = out["placed"]
    assert first == {"first_seq": "1", "last_seq": "1", "duplicate": False}  # pg: bigint as text
    assert retry == {"first_seq": "1", "last_seq": "1", "duplicate": True}
    assert await placed(pool, "o-node")
    refused, appended = out["refused"], out["appended"]
    assert (refused["refusal"], refused["last_seq"]) == ("expected_seq", "0")
    assert (appended["refusal"], appended["first_seq"]) == (None, "1")
    assert await journal_seqs(pool, "order-o-node-try") == [1]
    # A refusal raised by outbox_append reaches node as its SQLSTATE and one JSON-worded line.
    assert out["invalid"] == {"code": "OB001", "message": "campaign_id: must not be empty"}
