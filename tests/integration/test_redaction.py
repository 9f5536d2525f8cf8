"""The DSN password never appears in a repr, a log line or an error (three DSN forms)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import ROOT
from outbox import DatabaseUnavailable, Settings, db
from outbox.obs import log
from outbox.redact import dsn_secrets, redact_dsn, scrub

CANARY = "CANARY-9f3e"
# Closed loopback port: the connection is refused at once.
DSNS = {
    "userinfo": f"postgresql://app:{CANARY}@127.0.0.1:1/db",
    "at_sign": f"postgresql://app:pa@ss-{CANARY}@127.0.0.1:1/db",
    "query": f"postgresql://app@127.0.0.1:1/db?sslmode=disable&password={CANARY}",
    "query_first": f"postgresql://app@127.0.0.1:1/db?password={CANARY}&sslmode=disable",
    "percent_encoded": "postgresql://app:" + quote(f"p@ss/{CANARY}", safe="") + "@127.0.0.1:1/db",
}


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
def test_settings_repr_and_str_hide_the_password(dsn: str) -> None:
    s = Settings(dsn=dsn)
    assert CANARY not in repr(s)
    assert CANARY not in str(s)
    assert "127.0.0.1:1/db" in repr(s)


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


# Printable, no whitespace: what a password in a DSN can be made of.
passwords = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=0, max_size=24
).map(lambda s: f"{CANARY}{s}")


@given(passwords)
def test_redact_hides_any_userinfo_password(password: str) -> None:
    dsn = f"postgresql://user:{password}@db.internal:5432/app?sslmode=require"
    assert CANARY not in redact_dsn(dsn)
    assert CANARY not in scrub(f"failed: {dsn} and again {password}", dsn)


@given(passwords)
def test_redact_hides_any_query_password(password: str) -> None:
    dsn = f"postgresql://user@db:5432/app?sslmode=require&password={quote(password, safe='')}"
    assert CANARY not in redact_dsn(dsn)
    assert password in dsn_secrets(dsn)


@given(passwords)
def test_redact_hides_any_keyword_password(password: str) -> None:
    spaced = f"{password} x"
    quoted = spaced.replace("\\", "\\\\").replace("'", "\\'")
    forms = {
        password: f"host=db password={password} dbname=x",
        spaced: f"host=db password='{quoted}'",
    }
    for secret, dsn in forms.items():
        assert CANARY not in redact_dsn(dsn)
        assert CANARY not in scrub(f"{dsn} echoed {secret}", dsn)


def test_redact_leaves_dsns_without_password_alone() -> None:
    plain = "postgresql://app@db:5432/app?sslmode=require"
    assert redact_dsn(plain) == plain
