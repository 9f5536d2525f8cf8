"""Configuration that matches its docs: every OUTBOX_* setting the docs call an option is an
option of `outbox-worker`, errors never name an option that does not exist, and every worker
option can come from the environment."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from helpers import run_cli
from outbox.cli.worker import app
from outbox.config import FIELDS


def worker_options() -> dict[str, Any]:
    command = typer.main.get_command(app)
    return {opt: p for p in command.params for opt in p.opts}


def test_every_cli_setting_is_a_worker_option_of_the_same_name() -> None:
    options = worker_options()
    for spec in FIELDS.values():
        if spec.cli:
            assert spec.option in options, f"{spec.env}: no {spec.option}"
        else:
            assert spec.option not in options, f"{spec.env} is documented as environment only"


def test_every_worker_option_has_an_environment_variable() -> None:
    settings = {spec.option for spec in FIELDS.values()}  # read through Settings.from_env
    runs = {"--drain", "--drain-now", "--json", "--version", "--help", "-h"}
    for option, param in worker_options().items():
        if option in runs or option in settings or not option.startswith("--"):
            continue
        if option in ("--install-completion", "--show-completion"):
            continue
        assert getattr(param, "envvar", None), f"{option} has no environment variable"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--poll-interval", "0"], {}, "OUTBOX_POLL_INTERVAL (--poll-interval): must be at least"),
        (["--ordering", "random"], {}, "OUTBOX_ORDERING (--ordering): expected one of"),
        ([], {"OUTBOX_CONCURRENCY": "lots"}, "OUTBOX_CONCURRENCY"),
        ([], {"OUTBOX_ENABLED": "maybe"}, "OUTBOX_ENABLED: expected one of"),
        ([], {"OUTBOX_APPEND_KEY_TTL": "0"}, "OUTBOX_APPEND_KEY_TTL: must be at least 1"),
    ],
)
def test_bad_values_name_the_variable_and_only_real_options(
    dsn: str, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = run_cli(
        "outbox-worker", "--app", "campaigns_demo.app:app", "--drain-now", *args, dsn=dsn, env=env
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "--append-key-ttl" not in lines[0]
    assert "(--enabled)" not in lines[0]


def test_app_names_a_missing_attribute(dsn: str) -> None:
    proc = run_cli("outbox-worker", "--app", "campaigns_demo.app:nope", "--drain-now", dsn=dsn)
    assert proc.returncode == 2
    assert "module 'campaigns_demo.app' has no attribute 'nope'" in proc.stderr
