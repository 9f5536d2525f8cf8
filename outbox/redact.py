"""DSN redaction: the one place that knows where a PostgreSQL DSN can carry a password.

Pure functions, no imports from the rest of the package, so the log formatter, the settings
repr and the connection error paths can all use them. Forms covered: `user:pass@` in a URI
(a password containing '@' included), `?password=` / `&password=` in a URI query, and
`password=` in a keyword DSN, quoted or not.

A DSN with a typo is not a URI (`postgresql:/app:pw@db`, `postgresql//app:pw@db`,
`postgresql://app:pw/db`), and no parser can say where its password is. For a value known to
be a DSN (`redact_dsn`), every token that is not a valid URI or a keyword is redacted
loosely: from its first `:` that is not a scheme's `:/` to its last `@` (or, without an `@`,
to the next `/`, `?` or `#`; a token with no such `:` is redacted whole). `dsn_secrets`
returns the same spans, so `scrub` removes them from any text that echoes them (a libpq
error, a log line). Free text (`redact_text`) only
gets the exact forms: a loose rule there would mangle ordinary lines.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["REDACTED", "dsn_secrets", "redact_dsn", "redact_text", "scrub"]

REDACTED = "***"

# scheme://user:password@host... ; the password runs to the last '@' so that a password
# containing '@' is hidden whole (over-redacting a host is the safe direction).
_URI_USERINFO = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/?#@\s]*:)(?P<secret>.*)@", re.I)
# ?password=... / &password=... in a URI query: the value ends at the next '&' or '#'.
_QUERY = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#\s]*)", re.I)
# password=... in a keyword DSN: quoted, or up to whitespace ('&' is an ordinary character).
_KEYWORD = re.compile(
    r"(?P<head>(?<![?&\w])password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I
)


_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)
_KEYWORD_TOKEN = re.compile(r"^[a-z_]+\s*=", re.I)


# The same forms in free text, where a secret never runs past a double quote or a backslash:
# a log line is JSON, and a rule that ate its closing quote would corrupt the line. (A password
# holding those characters is caught whole by the exact-secret scrub, `log.add_secrets`.)
_TEXT_RULES = (
    (re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/?#@\s\"]*:)(?P<secret>[^\s\"\\]*)@", re.I), "@"),
    (re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#\s\"\\]*)", re.I), ""),
    (
        re.compile(
            r"(?P<head>(?<![?&\w])password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s\"\\]+)",
            re.I,
        ),
        "",
    ),
)
_DSN_RULES = ((_URI_USERINFO, "@"), (_QUERY, ""), (_KEYWORD, ""))


def _apply(rules: tuple[tuple[re.Pattern[str], str], ...], text: str) -> str:
    for pattern, tail in rules:
        text = pattern.sub(f"\\g<head>{REDACTED}{tail}", text)
    return text


def redact_text(text: str) -> str:
    """Hide every password the exact DSN forms (URI or keyword) carry in free text."""
    return _apply(_TEXT_RULES, text)


def _valid_uri(token: str) -> bool:
    if not _SCHEME.match(token):
        return False
    try:
        _ = urlsplit(token).port  # a bad port ("app:pw/db" without '@') is not a URI
    except ValueError:
        return False
    return True


def _loose_span(token: str) -> tuple[int, int] | None:
    """Where a password could sit in a token that is not a valid URI (see the docstring)."""
    if _valid_uri(token) or _KEYWORD_TOKEN.match(token):
        return None
    at = token.rfind("@")
    limit = at if at >= 0 else len(token)
    start = next(
        (i + 1 for i in range(limit) if token[i] == ":" and token[i + 1 : i + 2] != "/"), None
    )
    if start is None:  # no structure at all: the whole token could be the password
        return (0, len(token)) if token else None
    if at >= 0:
        end = at
    else:
        ends = [i for i in (token.find(c, start) for c in "/?#") if i >= 0]
        end = min(ends, default=len(token))
    return (start, end) if end > start else None


def redact_dsn(dsn: str) -> str:
    """Hide every password a DSN value can carry, a malformed one's included (see above)."""
    tokens = _apply(_DSN_RULES, dsn).split(" ")
    for i, token in enumerate(tokens):
        span = _loose_span(token)
        if span is not None and token[span[0] : span[1]] != REDACTED:
            tokens[i] = f"{token[: span[0]]}{REDACTED}{token[span[1] :]}"
    return " ".join(tokens)


def dsn_secrets(dsn: str | None) -> set[str]:
    """The password(s) a DSN carries, raw and percent-decoded, for scrubbing free text."""
    if not dsn:
        return set()
    found: set[str] = set()
    for m in _URI_USERINFO.finditer(dsn):
        found.add(m["secret"])
    for m in _QUERY.finditer(dsn):
        found.add(m["secret"])
    for m in _KEYWORD.finditer(dsn):
        secret = m["secret"]
        if secret.startswith("'"):
            secret = re.sub(r"\\(.)", r"\1", secret[1:-1])
        found.add(secret)
    try:
        parts = urlsplit(dsn)
        if parts.password:
            found.add(parts.password)
        for value in parse_qs(parts.query).get("password", []):
            found.add(value)
    except ValueError:
        pass
    for token in dsn.split():
        span = _loose_span(token)
        if span is not None:
            found.add(token[span[0] : span[1]])
    found |= {unquote(s) for s in found}
    return {s for s in found if s and s != REDACTED}


def scrub(text: str, dsn: str | None) -> str:
    """Redact DSN shapes and the DSN's literal password(s) out of free text, on one line."""
    text = redact_text(" ".join(text.split()))
    for secret in sorted(dsn_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
