"""docs/projections.md's end-to-end example for a team without Python, run as written: its
migration (a read model and its SQL projector), its projectors file, and its Node program
(`pg`), which appends in its own transactions while the stock worker applies from the file. A
request rolled back after its append leaves nothing; a client's keyed retry is a duplicate;
the read model is what the events say, after a drain and again after a rebuild."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import orjson

from helpers import ROOT, run_cli
from outbox import Event, append, db

EXAMPLE = re.compile(r"^```(\w+) example=([\w-]+)\n(.*?)^```$", re.M | re.S)
EXAMPLES = {
    name: code for _, name, code in EXAMPLE.findall((ROOT / "docs/projections.md").read_text())
}

# The service's requests, as a test drives the docs' `join`: two joins, the client's retry of
# the first, one that fails after its append (rolled back), one on another campaign.
RUN = """
const { Pool } = require("pg");
const { join } = require("./roster_join");

(async () => {
  const pool = new Pool({ connectionString: process.env.DATABASE_URL });
  const out = {};
  out.ada = await join(pool, "c-1", "Ada", "join-ada");
  out.bob = await join(pool, "c-1", "Bob", "join-bob");
  out.retry = await join(pool, "c-1", "Ada", "join-ada");
  try {
    await join(pool, "c-1", "Eve", "join-eve", { failAfter: true });
  } catch (err) {
    out.failed = err.message;
  }
  out.cyd = await join(pool, "c-2", "Cyd", "join-cyd");
  await pool.end();
  console.log(JSON.stringify(out));
})().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
"""


async def roster(pool: db.Pool) -> set[tuple[str, str, int]]:
    rows = await pool.fetch("SELECT campaign_id, character, joined_seq FROM app.roster")
    return {(r["campaign_id"], r["character"], r["joined_seq"]) for r in rows}


async def test_a_node_service_appends_and_the_stock_worker_projects_in_sql(
    pool: db.Pool, dsn: str, node_project: Path, tmp_path: Path
) -> None:
    await pool.execute(EXAMPLES["roster-schema"])
    projectors = tmp_path / "projectors.toml"
    projectors.write_text(EXAMPLES["roster-projectors"])
    (node_project / "roster_join.js").write_text(EXAMPLES["roster-node"])
    (node_project / "roster_run.js").write_text(RUN)
    proc = await anyio.run_process(
        ["node", "roster_run.js"], cwd=node_project, check=False,
        env={"DATABASE_URL": dsn, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    out = orjson.loads(proc.stdout)
    assert out["ada"] == {"first_seq": "1", "last_seq": "1", "duplicate": False}
    assert out["retry"] == {"first_seq": "1", "last_seq": "1", "duplicate": True}
    assert out["failed"] == "the request failed after its append"
    journal = await pool.fetch(
        "SELECT campaign_id, seq, payload->>'character' AS who FROM outbox.event_journal "
        "ORDER BY campaign_id, seq"
    )
    assert [(r["campaign_id"], r["seq"], r["who"]) for r in journal] == [
        ("c-1", 1, "Ada"),
        ("c-1", 2, "Bob"),
        ("c-2", 1, "Cyd"),
    ]  # Eve's append rolled back with her request; the retry wrote nothing
    drained = run_cli("outbox-worker", "--projectors", str(projectors), "--drain", dsn=dsn)
    assert drained.returncode == 0, drained.stderr
    assert await roster(pool) == {("c-1", "Ada", 1), ("c-1", "Bob", 2), ("c-2", "Cyd", 1)}

    # One batch in which Ada leaves and joins again and Bob leaves: each one's last word wins.
    await append(
        pool,
        "c-1",
        [
            Event("character.left", {"character": "Ada"}),
            Event("character.joined", {"character": "Ada"}),
            Event("character.left", {"character": "Bob"}),
            Event("campaign.renamed", {"name": "ignored"}),
        ],
    )
    drained = run_cli("outbox-worker", "--projectors", str(projectors), "--drain", dsn=dsn)
    assert drained.returncode == 0, drained.stderr
    assert await roster(pool) == {("c-1", "Ada", 4), ("c-2", "Cyd", 1)}

    # Rebuilt in place from the journal through the file's reset hook: the same read model.
    await pool.execute("DELETE FROM app.roster")
    rebuilt = run_cli(
        "maintenance", "projections-rebuild", "--app", str(projectors), "--projector", "roster",
        "--yes", dsn=dsn,
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert await roster(pool) == {("c-1", "Ada", 4), ("c-2", "Cyd", 1)}
