"""Settings: one frozen value built from `OUTBOX_*` environment variables and CLI overrides.

`Settings.from_env()` parses the environment, applies overrides (CLI options; `None` means
"not given"), and validates. Every problem is a one-line `ConfigError` naming the variable
(and its CLI option). Booleans accept true/false/1/0/yes/no/on/off and nothing else; an
empty variable counts as unset. The DSN password never shows in `repr()`.

Every knob of the worker lives here, the process's own included (concurrency, mode, shutdown
timeout, metrics address), so the CLI, `running_worker` and `drain_now` build the same service
from one value. `FIELDS` is also the source of the docs' configuration table and of the
`outbox-worker` options (one per setting, same name as its variable).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from outbox.config.fields import DEFAULT_GROUP, DSN_SCHEMES, FIELDS, SESSION_TIMEOUTS, shorten
from outbox.errors import ConfigError
from outbox.model import Background, DeadPolicy, Ordering, Unsubscribed, WorkerMode
from outbox.redact import redact_dsn

__all__ = ["ModeResolution", "Session", "Settings", "resolve_worker_mode"]


@dataclass(frozen=True, slots=True)
class Session:
    """The session a worker needs on every connection it borrows, whoever made the pool:
    `application_name`, the `explicit` parameters, and `fallback` ones applied only where the
    server gives no value (`outbox.db.ensure_session`)."""

    application_name: str
    explicit: Mapping[str, str]
    fallback: Mapping[str, str]


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    dsn: str | None = None
    enabled: bool = True
    worker_enabled: bool = True
    shadow_worker_enabled: bool = False
    inline_apply: bool = False
    batch_size: int = 100
    poll_interval: float = 1.0
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    max_attempts: int = 8
    ordering: Ordering = "campaign"
    dead_policy: DeadPolicy = "block"
    background: Background = "share"
    group: str = DEFAULT_GROUP
    unsubscribed: Unsubscribed = "skip"
    append_key_ttl: int = 86_400
    lease_seconds: float = 120.0
    dedup_scope: str | None = None
    buckets: int | None = None
    schema: str | None = None
    statement_timeout: float | None = None
    lock_timeout: float | None = None
    idle_in_transaction_timeout: float | None = None
    concurrency: int = 1
    max_concurrency: int | None = None
    mode: WorkerMode | None = None
    shutdown_timeout: float = 30.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __repr__(self) -> str:
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "dsn" and value is not None:
                value = redact_dsn(value)
            parts.append(f"{field.name}={value!r}")
        return f"Settings({', '.join(parts)})"

    __str__ = __repr__

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from `env` (default: os.environ), then `overrides` that are not None."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, spec in FIELDS.items():
            raw = env.get(spec.env)
            if raw is None or not raw.strip():
                continue
            try:
                values[name] = spec.parse(raw)
            except ValueError as exc:  # the variable's name: it came from the environment
                shown = "<redacted>" if name == "dsn" else shorten(raw)
                raise ConfigError(f"{spec.env}: {exc}, got {shown}") from None
        unknown = set(overrides) - FIELDS.keys()
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()

    @property
    def park(self) -> bool:
        """Whether a dead row steps aside (`park`) rather than block its campaign."""
        return self.dead_policy == "park"

    @property
    def grouped(self) -> bool:
        """Whether the worker serves a group of its own (S35): its projectors' holds, not the
        work rows."""
        return self.group != DEFAULT_GROUP

    @property
    def ordered(self) -> bool:
        """Whether rows of a campaign apply strictly in seq order (ordering `campaign`)."""
        return self.ordering == "campaign"

    def resolved_mode(self) -> Literal["apply", "shadow", "off"]:
        """What a worker started with these settings (and no --mode) runs; "off": it refuses."""
        try:
            return resolve_worker_mode(self).mode
        except ConfigError:
            return "off"

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (None means unchanged), validated."""
        return dataclasses.replace(
            self, **{k: v for k, v in changes.items() if v is not None}
        ).validate()

    def session_timeouts(self) -> tuple[dict[str, str], dict[str, str]]:
        """Worker session timeouts as (explicit, fallback) PostgreSQL settings in milliseconds.

        Which wins: an OUTBOX_* value (environment or CLI) is explicit and overrides everything,
        the DSN's options and ALTER ROLE/DATABASE ... SET included. Without one, the fallback
        (the documented default) applies only where the server gives the session no value of
        its own (`pg_settings.source = 'default'`), so an operator's settings are kept.
        """
        explicit: dict[str, str] = {}
        fallback: dict[str, str] = {}
        for name, (parameter, default) in SESSION_TIMEOUTS.items():
            value = getattr(self, name)
            target = fallback if value is None else explicit
            target[parameter] = str(round((default if value is None else value) * 1000))
        return explicit, fallback

    def session_settings(self, application_name: str) -> tuple[dict[str, str], dict[str, str]]:
        """(sent at connect, applied where the server has no value) for a worker session: a
        frozen worker must release its rows, so the timeouts always hold some value."""
        explicit, fallback = self.session_timeouts()
        return {"application_name": application_name, **explicit}, fallback

    def worker_session(self, application_name: str = "outbox-worker") -> Session:
        """The same session, for connections the worker borrows from a pool it did not make."""
        explicit, fallback = self.session_timeouts()
        return Session(application_name, explicit, fallback)

    def validate(self) -> Settings:
        for name, spec in FIELDS.items():
            value = getattr(self, name)
            if name == "dsn":
                if value is not None and (
                    not isinstance(value, str) or not value.startswith(DSN_SCHEMES)
                ):
                    shown = (
                        shorten(redact_dsn(value))
                        if isinstance(value, str)
                        else type(value).__name__
                    )
                    raise ConfigError(f"{spec.named}: expected a postgresql:// URI, got {shown}")
                continue
            if value is None and spec.optional:
                continue
            try:
                spec.check(value)
            except ValueError as exc:
                raise ConfigError(f"{spec.named}: {exc}, got {shorten(value)}") from None
        if self.max_concurrency is not None and self.max_concurrency < self.concurrency:
            raise ConfigError(
                f"OUTBOX_MAX_CONCURRENCY ({self.max_concurrency}) must not be below "
                f"OUTBOX_CONCURRENCY ({self.concurrency})"
            )
        if self.backoff_cap < self.backoff_base:
            raise ConfigError(
                f"OUTBOX_BACKOFF_CAP ({self.backoff_cap}) must not be below "
                f"OUTBOX_BACKOFF_BASE ({self.backoff_base})"
            )
        return self


@dataclass(frozen=True, slots=True)
class ModeResolution:
    mode: WorkerMode
    warning: str | None = None


def resolve_worker_mode(settings: Settings, requested: WorkerMode | None = None) -> ModeResolution:
    """The worker mode from the flags, `requested` (default: OUTBOX_MODE / --mode) overriding
    them.

    Both workers enabled: the apply worker runs, the shadow worker is disabled, with a warning.
    Enqueueing off, or no worker enabled: a ConfigError, the worker refuses to start.
    """
    if not settings.enabled:
        raise ConfigError(
            "OUTBOX_ENABLED is off: appends enqueue no work, so no worker may start "
            "(enable it, then run `maintenance reconcile` for what was appended meanwhile)"
        )
    requested = requested if requested is not None else settings.mode
    if requested is not None:
        return ModeResolution(requested)
    if settings.worker_enabled and settings.shadow_worker_enabled:
        return ModeResolution(
            "apply",
            "OUTBOX_WORKER_ENABLED and OUTBOX_SHADOW_WORKER_ENABLED are both on: the apply "
            "worker runs and the shadow worker is disabled",
        )
    if settings.worker_enabled:
        return ModeResolution("apply")
    if settings.shadow_worker_enabled:
        return ModeResolution("shadow")
    raise ConfigError(
        "no worker is enabled: set OUTBOX_WORKER_ENABLED or OUTBOX_SHADOW_WORKER_ENABLED, "
        "or pass --mode apply|shadow"
    )
