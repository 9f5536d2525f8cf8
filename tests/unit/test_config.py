"""Settings: environment parsing, ranges, one-line errors naming the variable."""

from __future__ import annotations

import pytest

from outbox import ConfigError, Settings
from outbox.config import FIELDS, resolve_worker_mode


def test_defaults() -> None:
    s = Settings.from_env({})
    assert (s.enabled, s.worker_enabled, s.shadow_worker_enabled, s.inline_apply) == (
        True,
        True,
        False,
        False,
    )
    assert (s.batch_size, s.poll_interval, s.max_attempts) == (100, 1.0, 8)
    assert (s.backoff_base, s.backoff_cap) == (1.0, 300.0)
    assert (s.ordering, s.dead_policy, s.append_key_ttl) == ("campaign", "block", 86_400)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(v, True) for v in ("true", "1", "yes", "on", "TRUE", " On ")]
    + [(v, False) for v in ("false", "0", "no", "off", "False", "OFF")],
)
def test_boolean_spellings(raw: str, expected: bool) -> None:
    for name, spec in FIELDS.items():
        if spec.env.endswith("ENABLED") or name == "inline_apply":
            assert getattr(Settings.from_env({spec.env: raw}), name) is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "enabled", "y", "t"])
@pytest.mark.parametrize(
    "env",
    [
        "OUTBOX_ENABLED",
        "OUTBOX_WORKER_ENABLED",
        "OUTBOX_SHADOW_WORKER_ENABLED",
        "OUTBOX_INLINE_APPLY",
    ],
)
def test_invalid_boolean_is_a_one_line_error_naming_the_variable(env: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({env: raw})
    message = str(info.value)
    assert message.startswith(f"{env}: ")
    assert repr(raw) in message
    assert "\n" not in message


def test_empty_variable_counts_as_unset() -> None:
    assert Settings.from_env({"OUTBOX_ENABLED": "", "OUTBOX_BATCH_SIZE": "  "}).batch_size == 100


@pytest.mark.parametrize(
    ("env", "raw"),
    [
        ("OUTBOX_BATCH_SIZE", "0"),
        ("OUTBOX_BATCH_SIZE", "10001"),
        ("OUTBOX_BATCH_SIZE", "ten"),
        ("OUTBOX_BATCH_SIZE", "1.5"),
        ("OUTBOX_POLL_INTERVAL", "0"),
        ("OUTBOX_POLL_INTERVAL", "-1"),
        ("OUTBOX_POLL_INTERVAL", "nan"),
        ("OUTBOX_POLL_INTERVAL", "inf"),
        ("OUTBOX_BACKOFF_BASE", "0"),
        ("OUTBOX_BACKOFF_CAP", "-5"),
        ("OUTBOX_MAX_ATTEMPTS", "0"),
        ("OUTBOX_MAX_ATTEMPTS", "1001"),
        ("OUTBOX_ORDERING", "random"),
        ("OUTBOX_DEAD_POLICY", "drop"),
        ("OUTBOX_APPEND_KEY_TTL", "0"),
        ("OUTBOX_APPEND_KEY_TTL", "1e3"),
    ],
)
def test_out_of_range_or_malformed_numbers_are_one_line_errors(env: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({env: raw})
    assert str(info.value).startswith(env)
    assert "\n" not in str(info.value)


def test_cap_below_base_is_refused() -> None:
    with pytest.raises(ConfigError, match="OUTBOX_BACKOFF_CAP"):
        Settings.from_env({"OUTBOX_BACKOFF_BASE": "10", "OUTBOX_BACKOFF_CAP": "5"})


def test_choices_are_case_insensitive() -> None:
    s = Settings.from_env({"OUTBOX_ORDERING": "None", "OUTBOX_DEAD_POLICY": "PARK"})
    assert (s.ordering, s.dead_policy) == ("none", "park")


def test_overrides_win_over_the_environment_and_none_means_not_given() -> None:
    env = {"OUTBOX_BATCH_SIZE": "7", "OUTBOX_DSN": "postgresql://h/db"}
    s = Settings.from_env(env, batch_size=None, dsn="postgresql://other/db")
    assert (s.batch_size, s.dsn) == (7, "postgresql://other/db")
    assert Settings.from_env(env, batch_size=9).batch_size == 9


def test_override_out_of_range_names_variable_and_option() -> None:
    with pytest.raises(ConfigError, match=r"OUTBOX_BATCH_SIZE \(--batch-size\)"):
        Settings.from_env({}, batch_size=0)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.from_env({}, batch_sizes=3)


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.batch_size = 5  # type: ignore[misc]


@pytest.mark.parametrize("dsn", ["host=db user=u password=CANARY", "mysql://u:CANARY@h/db"])
def test_non_uri_dsn_is_refused_without_echoing_the_password(dsn: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"OUTBOX_DSN": dsn})
    assert "CANARY" not in str(info.value)
    assert str(info.value).startswith("OUTBOX_DSN")


def test_the_worker_process_knobs_are_settings_with_variables() -> None:
    env = {
        "OUTBOX_CONCURRENCY": "4",
        "OUTBOX_MODE": "Shadow",
        "OUTBOX_SHUTDOWN_TIMEOUT": "7.5",
        "OUTBOX_METRICS_PORT": "9100",
        "OUTBOX_METRICS_HOST": "0.0.0.0",  # noqa: S104 - a value under test, nothing binds
    }
    s = Settings.from_env(env)
    assert (s.concurrency, s.mode, s.shutdown_timeout) == (4, "shadow", 7.5)
    assert (s.metrics_port, s.metrics_host) == (9100, "0.0.0.0")  # noqa: S104
    assert resolve_worker_mode(s).mode == "shadow"  # OUTBOX_MODE over the worker flags
    with pytest.raises(ConfigError, match=r"OUTBOX_CONCURRENCY \(--concurrency\)"):
        Settings.from_env({"OUTBOX_CONCURRENCY": "0"})
    with pytest.raises(ConfigError, match=r"OUTBOX_MODE \(--mode\): expected one of"):
        Settings.from_env({"OUTBOX_MODE": "both"})


def test_settings_answer_park_and_ordering_once() -> None:
    assert (Settings().park, Settings().ordered) == (False, True)
    assert Settings(dead_policy="park").park
    assert not Settings(ordering="none").ordered
