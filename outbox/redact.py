"""DSN redaction: the one place that knows where a PostgreSQL DSN can carry a password.

Pure functions, no imports from the rest of the package, so the log formatter, the settings
repr and the connection error paths can all use them. Forms covered: `user:pass@` in a URI
(a password containing '@' included), `?password=` / `&password=` in a URI query, and
`password=` in a keyword DSN, quoted or not.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["REDACTED", "dsn_secrets", "redact_dsn", "scrub"]

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


def redact_dsn(text: str) -> str:
    """Hide every password a DSN (URI or keyword form) can carry; safe on arbitrary text."""
    text = _URI_USERINFO.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    text = _QUERY.sub(lambda m: f"{m['head']}{REDACTED}", text)
    return _KEYWORD.sub(lambda m: f"{m['head']}{REDACTED}", text)


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
    found |= {unquote(s) for s in found}
    return {s for s in found if s}


def scrub(text: str, dsn: str | None) -> str:
    """Redact DSN shapes and the DSN's literal password(s) out of free text, on one line."""
    text = redact_dsn(" ".join(text.split()))
    for secret in sorted(dsn_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
