"""The wheel works alone: built and installed by README's install block as written (a fresh
virtualenv, a copy of the checkout, the console extra), it migrates, appends, drains with the
worker and serves the console from an empty directory; the sdist carries what a build needs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import asyncpg
import httpx
import pytest

from helpers import ROOT

# What a copy of the checkout leaves out: local state, not sources.
COPY_IGNORE = (".venv", ".git", ".outbox", "dist", "build", "*.egg-info", "__pycache__", ".*_cache")


def readme_install() -> str:
    """The commands of README's install block (its comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Install", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return "\n".join(line.split("  #", 1)[0].rstrip() for line in block.splitlines())


def run_readme_install(checkout: Path, venv: Path) -> None:
    """README's install block in `checkout`, `python` being `venv`'s."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "PIP_QUIET": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_install()],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"README's install failed: {proc.stderr[-2000:]}"


def sh(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"{args[:3]} failed: {proc.stderr[-2000:]}"
    return proc


@pytest.mark.slow
async def test_wheel_installs_and_migrates_from_outside_the_source_tree(
    tmp_path: Path, fresh_db: str
) -> None:
    dist = tmp_path / "dist"
    # The sdist (the dev's `python -m build`) carries what a wheel built from it needs.
    sh(sys.executable, "-m", "build", "--sdist", "--outdir", dist, ROOT, cwd=tmp_path)
    (sdist,) = dist.glob("pg_outbox-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        members = {m.name.removeprefix(f"{top}/") for m in archive.getmembers()}
    assert {
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "sql/0001_schema.sql",
    } <= members
    # README's install, as written, in a fresh virtualenv (`python` is its own) on a copy of
    # the checkout: nothing installed first but what `python -m venv` gives.
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(*COPY_IGNORE))
    run_readme_install(checkout, venv)
    (wheel,) = (checkout / "dist").glob("pg_outbox-*.whl")  # the distribution's name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "outbox/migrations/0001_schema.sql" in names
    # Every module's named SQL ships beside it.
    assert {str(f.relative_to(ROOT)) for f in (ROOT / "outbox").rglob("*.sql")} <= names
    assert "outbox/py.typed" in names
    assert not any(n.startswith(("tests/", "cmd/")) for n in names)
    version = sh(venv / "bin" / "python", "-m", "outbox", "--version", cwd=tmp_path).stdout
    assert wheel.name.startswith(f"pg_outbox-{version.split()[-1]}-")
    # Run from an empty directory so nothing can be read from the checkout.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = sh(
        venv / "bin" / "python", "-c", "import outbox; print(outbox.__file__)", cwd=elsewhere
    )
    assert str(ROOT) not in where.stdout
    proc = sh(venv / "bin" / "maintenance", "migrate", "--dsn", fresh_db, cwd=elsewhere)
    assert "applied 0001_schema.sql" in proc.stdout
    _user_code_type_checks_against_the_wheel(venv, elsewhere)
    _appends_drains_and_serves_from_the_wheel(venv, elsewhere, fresh_db)

    conn = await asyncpg.connect(fresh_db)
    try:
        assert await conn.fetchval(
            "SELECT to_regclass('outbox.projection_apply_outbox') IS NOT NULL"
        )
    finally:
        await conn.close()


WHEEL_APP = """
import asyncio
import sys

import outbox

app = outbox.Outbox()


@app.projector("counted", events=["deposited"])
async def counted(tx, event):
    await tx.execute(
        "INSERT INTO wheel_counts VALUES ($1, $2, $3)",
        event.campaign_id, event.seq, event.payload["amount"],
    )


async def main(command, dsn):
    pool = await outbox.create_pool(dsn)
    try:
        if command == "append":
            await pool.execute("CREATE TABLE wheel_counts (campaign_id text, seq int, amount int)")
            events = [outbox.Event("deposited", {"amount": n}) for n in (5, 7)]
            await app.append(pool, "acct", events, idempotency_key="first")
        else:
            rows = await pool.fetch("SELECT seq, amount FROM wheel_counts ORDER BY seq")
            print([tuple(r) for r in rows])
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
"""


def _appends_drains_and_serves_from_the_wheel(venv: Path, where: Path, dsn: str) -> None:
    """From the installed wheel alone: an append, a worker's drain onto a read model, and
    `maintenance console` answering."""
    (where / "wheel_app.py").write_text(WHEEL_APP)
    python = venv / "bin" / "python"
    sh(python, "wheel_app.py", "append", dsn, cwd=where)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(where)}
    drained = subprocess.run(
        [venv / "bin" / "outbox-worker", "--app", "wheel_app:app", "--dsn", dsn, "--drain"],
        cwd=where, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert drained.returncode == 0, drained.stderr[-2000:]
    assert sh(python, "wheel_app.py", "read", dsn, cwd=where).stdout.strip() == "[(1, 5), (2, 7)]"
    console = subprocess.Popen(
        [venv / "bin" / "maintenance", "console", "--dsn", dsn, "--port", "0"],
        cwd=where, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert console.stderr is not None
        line = console.stderr.readline()  # printed once it listens
        assert line.startswith("console: http://127.0.0.1:"), line
        body = httpx.get(line.split()[1] + "api/overview", timeout=30).json()
        assert body["data"]["overview"]["counts"]["pending"] == 0
    finally:
        console.terminate()
        console.wait(timeout=30)


USER_MODULE = """
from collections.abc import Sequence

import outbox
from outbox import dedup
from outbox.db import Connection, Pool

app = outbox.Outbox()


@app.projector("totals", events=["deposited"], batch=True)
async def totals(tx: Connection, events: Sequence[outbox.StoredEvent]) -> None:
    await tx.executemany("SELECT $1::int", [(e.payload["amount"],) for e in events])


async def deposit(pool: Pool, account: str, amount: int, request: str) -> int:
    result: outbox.AppendResult = await app.append(
        pool, account, [outbox.Event("deposited", {"amount": amount})], idempotency_key=request
    )
    return result.first_seq
"""

WRONG = """
import outbox

seq: str = outbox.AppendResult("c", 1, 1).first_seq
"""


def _user_code_type_checks_against_the_wheel(venv: Path, where: Path) -> None:
    """`mypy --strict` on an application module, resolving `outbox` from the installed wheel
    (its py.typed marker): clean code passes, a type error in the use of the API is caught."""
    (where / "user_app.py").write_text(USER_MODULE)
    (where / "user_wrong.py").write_text(WRONG)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    target = ["--python-executable", str(venv / "bin" / "python")]
    sh(*mypy, *target, "user_app.py", cwd=where)
    wrong = subprocess.run(
        [*mypy, *target, "user_wrong.py"], cwd=where, capture_output=True, text=True, check=False
    )
    assert wrong.returncode == 1, wrong.stdout
    assert 'Incompatible types in assignment (expression has type "int"' in wrong.stdout
