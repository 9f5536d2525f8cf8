"""The redaction rules: a DSN password never shows in a repr or in text that echoes it."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import CANARY, DSNS
from outbox import Settings
from outbox.redact import dsn_secrets, redact_dsn, scrub


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
def test_settings_repr_and_str_hide_the_password(dsn: str) -> None:
    s = Settings(dsn=dsn)
    assert CANARY not in repr(s)
    assert CANARY not in str(s)
    assert "127.0.0.1:1/db" in repr(s)


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
