"""The DSN password never appears in a log line or a connection error (the DSN forms are
`helpers.DSNS`; `unit/test_redaction_rules.py` checks the rules themselves)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import orjson
import pytest

from helpers import CANARY, DSNS, ROOT
from outbox import DatabaseUnavailable, db
from outbox.obs import log


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
async def test_connection_error_is_one_redacted_line(dsn: str) -> None:
    with pytest.raises(DatabaseUnavailable) as info:
        await db.connect(dsn, connect_timeout=5)
    message = str(info.value)
    assert CANARY not in message
    assert "\n" not in message
    assert message.startswith("cannot connect to postgresql://app")
    assert info.value.__cause__ is None


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
async def test_pool_error_is_redacted(dsn: str) -> None:
    with pytest.raises(DatabaseUnavailable) as info:
        await db.create_pool(dsn, connect_timeout=5)
    assert CANARY not in str(info.value)


def fail_with(message: str) -> None:
    raise RuntimeError(message)


@pytest.fixture
def captured_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    log.configure("debug", stream)
    try:
        yield stream
    finally:
        log.unconfigure()


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
async def test_log_lines_never_carry_the_password(dsn: str, captured_log: io.StringIO) -> None:
    with pytest.raises(DatabaseUnavailable) as info:
        await db.connect(dsn, connect_timeout=5)
    logger = log.get_logger("outbox.test")
    # Careless lines: the raw DSN as a field, in the message, in an exception.
    logger.warning("connect.failed", extra={"dsn": dsn, "detail": f"while using {dsn}"})
    logger.error("raw %s", dsn)
    try:
        fail_with(f"wrapped {dsn}")
    except RuntimeError:
        logger.exception("crash")
    logger.info("error", extra={"error": str(info.value)})
    output = captured_log.getvalue()
    mine = [ln for ln in output.splitlines() if orjson.loads(ln)["logger"] == "outbox.test"]
    assert len(mine) == 4
    assert CANARY not in output
    assert quote(CANARY) not in output


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
def test_cli_connection_error_is_one_redacted_line(dsn: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "cmd" / "maintenance.py"), "migrate", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUTBOX_LOG_LEVEL": "info"},
        check=False,
    )
    assert proc.returncode == 1
    assert CANARY not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("maintenance: error: cannot connect to")


def test_cli_reads_the_dsn_from_the_environment_without_echoing_it() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "cmd" / "maintenance.py"), "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUTBOX_DSN": DSNS["at_sign"]},
        check=False,
    )
    assert proc.returncode == 1
    assert CANARY not in proc.stderr
