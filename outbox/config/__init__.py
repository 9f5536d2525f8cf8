"""Configuration: one frozen `Settings` from `OUTBOX_*` variables and CLI overrides.

`fields` says how each variable is read and checked (`FIELDS`, also the source of the
`outbox-worker` options and the docs' table); `settings` holds the `Settings` value, its
validation and the worker-mode rules. Everything is re-exported here.
"""

from outbox.config.fields import (
    DEFAULT_SCHEMA,
    FIELDS,
    SESSION_TIMEOUTS,
    FieldSpec,
    check_schema_name,
    parse_bool,
    shorten,
)
from outbox.config.settings import ModeResolution, Session, Settings, resolve_worker_mode

__all__ = [
    "DEFAULT_SCHEMA",
    "FIELDS",
    "SESSION_TIMEOUTS",
    "FieldSpec",
    "ModeResolution",
    "Session",
    "Settings",
    "check_schema_name",
    "parse_bool",
    "resolve_worker_mode",
    "shorten",
]
