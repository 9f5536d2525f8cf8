"""How each setting is read and checked: one `FieldSpec` per `OUTBOX_*` variable.

`FIELDS` is the table `Settings.from_env` reads, the source of every `outbox-worker` option
(one per setting, the same name as its variable) and of the docs' configuration table. Pure:
parsing and range checks, no environment access of its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outbox.errors import ConfigError

__all__ = [
    "DEFAULT_SCHEMA",
    "DSN_SCHEMES",
    "FIELDS",
    "SESSION_TIMEOUTS",
    "FieldSpec",
    "check_schema_name",
    "parse_bool",
    "shorten",
]

# asyncpg takes URIs only (libpq keyword DSNs are refused by the driver).
DSN_SCHEMES = ("postgresql://", "postgres://")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected one of true/false/1/0/yes/no/on/off")


def _parse_int(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def _parse_float(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


SHOWN_LIMIT = 80


def shorten(value: object, limit: int = SHOWN_LIMIT) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: a bad value is echoed
    so the operator can spot it, never at full length."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def _parse_text(raw: str) -> str:
    return raw.strip()


def _parse_word(raw: str) -> str:
    return raw.strip().lower()


# A schema the outbox may live in: a plain lower-case identifier (never quoted, so the same
# text names it in SQL, in a setting and in a NOTIFY channel), short enough that its channels'
# names (`<schema>.outbox_applied`) stay within PostgreSQL's 63 bytes, and none of the system's.
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
DEFAULT_SCHEMA = "outbox"


def check_schema_name(name: object) -> str:
    """`name` if the outbox may live in a schema of that name; else ValueError."""
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise ValueError(
            "expected a lower-case identifier of at most 48 characters (a-z, 0-9, _; not "
            "starting with a digit)"
        )
    if name.startswith("pg_") or name == "information_schema":
        raise ValueError("expected a schema of your own, not one of the system's")
    return name


def _parse_schema(raw: str) -> str:
    return check_schema_name(raw.strip())


# A worker group's name (S35): the same plain identifier, so that it reads the same in a
# setting, the record and a NOTIFY's payload.
DEFAULT_GROUP = "default"


def check_group_name(name: object) -> str:
    """`name` if a worker group may be called so; else ValueError."""
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise ValueError(
            "expected a lower-case identifier of at most 48 characters (a-z, 0-9, _; not "
            "starting with a digit)"
        )
    return name


def _parse_group(raw: str) -> str:
    return check_group_name(raw.strip())


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one setting is read and checked; also the source of the docs' configuration table."""

    env: str
    parse: Callable[[str], Any]
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False  # None is a valid value ("not set")
    cli: bool = True  # `outbox-worker` (or, for the DSN, every command) has the option

    @property
    def option(self) -> str:
        return "--" + self.env.removeprefix("OUTBOX_").lower().replace("_", "-")

    @property
    def metavar(self) -> str:
        """What the option's value looks like, for --help."""
        if self.choices:
            return "|".join(self.choices).upper()
        kinds: dict[Callable[[str], Any], str] = {
            parse_bool: "BOOLEAN",
            _parse_int: "INTEGER",
            _parse_float: "NUMBER",
        }
        return kinds.get(self.parse, "TEXT")

    def read(self, raw: str) -> Any:
        """`raw` (a variable's or an option's text) as the setting's value; a ConfigError naming
        the setting when it is not one."""
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.named}: {exc}, got {shorten(raw.strip())}") from None

    @property
    def named(self) -> str:
        """How an error names the setting: the variable, and its option where one exists."""
        return f"{self.env} ({self.option})" if self.cli else self.env

    def check(self, value: Any) -> None:
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {'/'.join(self.choices)}")
        if self.parse is _parse_schema:
            check_schema_name(value)
        if self.parse is _parse_group:
            check_group_name(value)
        if self.parse is parse_bool and not isinstance(value, bool):
            raise ValueError("expected a boolean")
        if self.parse in (_parse_int, _parse_float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError("expected a number")
            if self.parse is _parse_int and not isinstance(value, int):
                raise ValueError("expected an integer")
            if not math.isfinite(value):
                raise ValueError("expected a finite number")
            if self.low is not None and value < self.low:
                raise ValueError(f"must be at least {_fmt(self.low)}")
            if self.high is not None and value > self.high:
                raise ValueError(f"must be at most {_fmt(self.high)}")


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


FIELDS: dict[str, FieldSpec] = {
    "dsn": FieldSpec(
        "OUTBOX_DSN", _parse_text, "PostgreSQL URI, `postgresql://user:pass@host:port/db`"
    ),
    # Flags of a deployment (`--mode` overrides the worker flags for one process), and
    # settings of the application's own append path: environment only.
    "enabled": FieldSpec(
        "OUTBOX_ENABLED", parse_bool, "enqueue one work row per appended event", cli=False
    ),
    "worker_enabled": FieldSpec(
        "OUTBOX_WORKER_ENABLED", parse_bool, "the apply worker may run", cli=False
    ),
    "shadow_worker_enabled": FieldSpec(
        "OUTBOX_SHADOW_WORKER_ENABLED",
        parse_bool,
        "the shadow worker may run (apply wins)",
        cli=False,
    ),
    "inline_apply": FieldSpec(
        "OUTBOX_INLINE_APPLY",
        parse_bool,
        "apply projectors inside the append transaction",
        cli=False,
    ),
    "batch_size": FieldSpec(
        "OUTBOX_BATCH_SIZE", _parse_int, "rows claimed per batch", low=1, high=10_000
    ),
    "poll_interval": FieldSpec(
        "OUTBOX_POLL_INTERVAL",
        _parse_float,
        "seconds between polls without NOTIFY",
        low=0.01,
        high=3600,
    ),
    "backoff_base": FieldSpec(
        "OUTBOX_BACKOFF_BASE",
        _parse_float,
        "seconds of delay after the first failure",
        low=0.001,
        high=86_400,
    ),
    "backoff_cap": FieldSpec(
        "OUTBOX_BACKOFF_CAP",
        _parse_float,
        "upper bound of the retry delay, seconds",
        low=0.001,
        high=7 * 86_400,
    ),
    "max_attempts": FieldSpec(
        "OUTBOX_MAX_ATTEMPTS", _parse_int, "failed attempts before a row is dead", low=1, high=1000
    ),
    "ordering": FieldSpec(
        "OUTBOX_ORDERING",
        _parse_word,
        "`campaign`: strict seq order per campaign; `none`: any",
        choices=("campaign", "none"),
    ),
    "background": FieldSpec(
        "OUTBOX_BACKGROUND",
        _parse_word,
        "background work (catch-ups, hold-only campaigns; S25): `share` (appends first, then "
        "the rest), `only` (a catch-up worker: nothing else), `never` (appends' work alone)",
        choices=("share", "only", "never"),
    ),
    "group": FieldSpec(
        "OUTBOX_GROUP",
        _parse_group,
        "the worker group this worker serves its projectors in (S35): `default` claims the "
        "work rows; any other name serves its projectors' own queue, written by the append, "
        "so that a group's projectors keep their latency beside another group's",
    ),
    "dead_policy": FieldSpec(
        "OUTBOX_DEAD_POLICY",
        _parse_word,
        "`block`: a dead row blocks its campaign; `park`: not",
        choices=("block", "park"),
    ),
    "append_key_ttl": FieldSpec(
        "OUTBOX_APPEND_KEY_TTL",
        _parse_int,
        "seconds an append idempotency key is honoured",
        low=1,
        high=366 * 86_400,
        cli=False,
    ),
    "unsubscribed": FieldSpec(
        "OUTBOX_UNSUBSCRIBED",
        _parse_word,
        "events no projector subscribes to: `skip` (complete them, applied nowhere) or `retry` "
        "(fail them until a projector is deployed)",
        choices=("skip", "retry"),
    ),
    "lease_seconds": FieldSpec(
        "OUTBOX_LEASE_SECONDS",
        _parse_float,
        "lease of a row a non-transactional projector runs (extended every third of it)",
        low=1,
        high=86_400,
    ),
    "dedup_scope": FieldSpec(
        "OUTBOX_DEDUP_SCOPE",
        _parse_text,
        "default scope of the consumer dedup guard (`outbox.dedup`); unset: pass one per call",
        optional=True,
        cli=False,
    ),
    "buckets": FieldSpec(
        "OUTBOX_BUCKETS",
        _parse_int,
        "buckets the campaign-keyed tables are split into, fixed by the first `maintenance "
        "migrate` (unset: 64); a later migrate refuses a different number",
        low=1,
        high=4096,
        optional=True,
        cli=False,
    ),
    "schema": FieldSpec(
        "OUTBOX_SCHEMA",
        _parse_schema,
        "the schema that holds every table, function and type of the outbox, chosen by the "
        "first `maintenance migrate` (unset: `outbox`); an install made before schemas were an "
        "option lives in `public`",
        optional=True,
        cli=False,
    ),
    "statement_timeout": FieldSpec(
        "OUTBOX_STATEMENT_TIMEOUT",
        _parse_float,
        "worker sessions' `statement_timeout`, seconds (0: none); unset: 30 unless the server "
        "sets one",
        low=0,
        high=86_400,
        optional=True,
    ),
    "lock_timeout": FieldSpec(
        "OUTBOX_LOCK_TIMEOUT",
        _parse_float,
        "worker sessions' `lock_timeout`, seconds (0: none); unset: 5 unless the server sets one",
        low=0,
        high=86_400,
        optional=True,
    ),
    "idle_in_transaction_timeout": FieldSpec(
        "OUTBOX_IDLE_IN_TRANSACTION_TIMEOUT",
        _parse_float,
        "worker sessions' `idle_in_transaction_session_timeout`, seconds (0: none); unset: 60 "
        "unless the server sets one",
        low=0,
        high=86_400,
        optional=True,
    ),
    # The worker process itself.
    "concurrency": FieldSpec(
        "OUTBOX_CONCURRENCY", _parse_int, "claim loops of the worker", low=1, high=256
    ),
    "max_concurrency": FieldSpec(
        "OUTBOX_MAX_CONCURRENCY",
        _parse_int,
        "the most claim loops the worker grows to while a backlog lasts (unset: 4 for "
        "`outbox-worker`, or its concurrency when larger; an embedded worker: its concurrency)",
        low=1,
        high=256,
        optional=True,
    ),
    "mode": FieldSpec(
        "OUTBOX_MODE",
        _parse_word,
        "`apply` or `shadow` for this process, over the two worker flags",
        choices=("apply", "shadow"),
        optional=True,
    ),
    "shutdown_timeout": FieldSpec(
        "OUTBOX_SHUTDOWN_TIMEOUT",
        _parse_float,
        "seconds a stopping worker lets its batch finish",
        low=0,
        high=3600,
    ),
    "metrics_port": FieldSpec(
        "OUTBOX_METRICS_PORT",
        _parse_int,
        "serve Prometheus `/metrics` on this port (0: any free port)",
        low=0,
        high=65_535,
        optional=True,
    ),
    "metrics_host": FieldSpec(
        "OUTBOX_METRICS_HOST",
        _parse_text,
        "the address `/metrics` binds to (`0.0.0.0`: every interface)",
    ),
}

# Worker session timeouts: setting -> (PostgreSQL parameter, default seconds). A frozen worker
# must release its rows, so these apply where neither OUTBOX_* nor the server (DSN options,
# ALTER ROLE/DATABASE ... SET, postgresql.conf) gives a value; see `Settings.session_timeouts`.
SESSION_TIMEOUTS: dict[str, tuple[str, float]] = {
    "statement_timeout": ("statement_timeout", 30.0),
    "lock_timeout": ("lock_timeout", 5.0),
    "idle_in_transaction_timeout": ("idle_in_transaction_session_timeout", 60.0),
}
