"""What every command line shares: the one choke point for errors, the async runner, output.

`main(app, prog)` runs a typer app so that any failure becomes one line on stderr and an exit
code: 2 for bad usage (`UsageError`, `ConfigError`, `ValidationError`: before any connection
opens), 1 for any other failure, 130 when interrupted. Errors are printed as they are raised,
never re-wrapped. Tracebacks appear only with `OUTBOX_LOG_LEVEL=debug`. `emit_json` writes a
typed result (a dataclass: its fields, in order, are the keys) as orjson with `schema_version`
to stdout; notes go to stderr, never mixed into data.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Annotated, Any, NoReturn, TypeVar

import anyio
import orjson
import typer
from rich.console import Console

from outbox import db
from outbox.config import Settings, shorten
from outbox.errors import ConfigError, OutboxError, UsageError, ValidationError
from outbox.obs import log
from outbox.projection.app import Outbox
from outbox.projection.projectors_file import load_projectors
from outbox.redact import REDACTED, dsn_secrets
from outbox.retry import sole_error

__all__ = [
    "CONTEXT_SETTINGS",
    "SCHEMA_VERSION",
    "AppOption",
    "DsnOption",
    "Interrupted",
    "Invocation",
    "JsonOption",
    "LogFormatOption",
    "VersionOption",
    "emit_json",
    "load_app",
    "main",
    "prepare_app",
    "require_dsn",
    "run",
    "settings_for",
    "stderr",
    "stdout",
]

SCHEMA_VERSION = 1
T = TypeVar("T")

# No markup: what the commands print holds data (ids, errors, payloads), and rich would style
# "[red]" in it or fail on "[/x]"; styling is given as rich objects, never as markup.
stderr = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)
# Piped output (a file, a pager, a test) gets room for the wide tables, unless COLUMNS says
# how wide the reader is.
stdout = Console(
    highlight=False,
    markup=False,
    width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160,
)

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        show_default=False,
        help="PostgreSQL DSN (default: `maintenance --dsn`, then OUTBOX_DSN); the password "
        "never appears in output.",
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Write JSON (schema_version 1) to stdout.")
]


AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        envvar="OUTBOX_APP",
        help="module:attribute of the outbox.Outbox app, or a projectors file (*.toml).",
    ),
]

LogFormatOption = Annotated[
    str,
    typer.Option(
        "--log-format",
        envvar="OUTBOX_LOG_FORMAT",
        help="json (one object per line, the default) or text (for humans).",
    ),
]

# Both CLIs: -h as well as --help.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def _print_version(value: bool) -> None:
    if value:
        from outbox import __version__  # the package's, also when installed from a wheel

        typer.echo(f"outbox {__version__}")
        raise typer.Exit


VersionOption = Annotated[
    bool,
    typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
]


def _debug() -> bool:
    return os.environ.get("OUTBOX_LOG_LEVEL", "").strip().lower() == "debug"


# The longest error line the CLIs write: an echoed argument never makes it longer.
MAX_ERROR_LINE = 400
# The exit code of an interrupted command (128 + SIGINT), as shells report it.
INTERRUPTED = 130


def _secrets_in_use(args: list[str]) -> set[str]:
    """Passwords of every DSN this invocation was given (--dsn, OUTBOX_DSN), malformed ones
    included, so no error line can echo one whatever produced it."""
    dsns = [os.environ.get("OUTBOX_DSN", "")]
    for i, arg in enumerate(args):
        if arg == "--dsn" and i + 1 < len(args):
            dsns.append(args[i + 1])
        elif arg.startswith("--dsn="):
            dsns.append(arg.removeprefix("--dsn="))
    return {s for dsn in dsns for s in dsn_secrets(dsn)}


def _fail(prog: str, message: str, code: int, args: list[str] | None = None) -> NoReturn:
    line = log.scrub(" ".join(message.split()))
    for secret in sorted(_secrets_in_use(args or []), key=len, reverse=True):
        line = line.replace(secret, REDACTED)
    if len(line) > MAX_ERROR_LINE:
        line = line[: MAX_ERROR_LINE - 1] + "…"
    print(f"{prog}: error: {line}", file=sys.stderr)
    raise SystemExit(code)


class Interrupted(Exception):
    """Ctrl-C in a command that says how to go on (an interrupted build: how to resume):
    `main` prints `interrupted: <this>` and exits 130."""


class Invocation:
    """What the tool's own options said, for its commands: `maintenance --dsn X command` (the
    root callback sets it; one command runs per process)."""

    dsn: str | None = None


def settings_for(**overrides: Any) -> Settings:
    """Settings from the environment plus CLI options; a command's `--dsn` falls back to the
    tool's own (`Invocation.dsn`), then to OUTBOX_DSN."""
    if "dsn" in overrides:
        overrides["dsn"] = overrides["dsn"] or Invocation.dsn
    return Settings.from_env(**overrides)


def load_app(path: str) -> Outbox:
    """`module:attribute` → the Outbox app it names, or a projectors file (`*.toml`) → the
    app its SQL projectors make; any problem is a usage error."""
    if path.endswith(".toml"):
        return load_projectors(path)
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"--app: expected module:attribute, got {shorten(path)}")
    sys.path.insert(0, os.getcwd())  # like `python -m`: the working directory's modules
    try:
        module = importlib.import_module(module_name)
    except ConfigError:
        raise  # a bad OUTBOX_* value met while the app builds its settings: exit 2 as it is
    except Exception as exc:
        raise UsageError(
            f"--app: cannot import {shorten(module_name)}: {type(exc).__name__}: {exc}"
        ) from None
    if not hasattr(module, attribute):
        raise UsageError(
            f"--app: module {shorten(module_name)} has no attribute {shorten(attribute)}"
        )
    found = getattr(module, attribute)
    if not isinstance(found, Outbox):
        raise UsageError(f"--app: {shorten(path)} is {type(found).__name__}, not an outbox.Outbox")
    return found


def prepare_app(app_path: str | None, **overrides: Any) -> Outbox:
    """The --app, with option overrides applied and validated, and a database named: every
    problem a usage error, raised before any connection opens."""
    if not app_path:
        raise UsageError(
            "no app given: pass --app module:attribute (or a projectors file) or set OUTBOX_APP"
        )
    outbox_app = load_app(app_path)
    if "dsn" in overrides:
        overrides["dsn"] = overrides["dsn"] or Invocation.dsn
    outbox_app.settings = outbox_app.settings.replace(**overrides)
    outbox_app.validate()
    require_dsn(outbox_app.settings)
    return outbox_app


def require_dsn(settings: Settings) -> str:
    if not settings.dsn:
        raise UsageError("no database given: pass --dsn or set OUTBOX_DSN")
    return settings.dsn


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async command body on the asyncio backend."""
    return anyio.run(fn, backend="asyncio")


class JsonTicker:
    """Progress as JSON lines (`emit_json` under `mode`), at most one every `interval`
    seconds: a long run's progress for a machine, beside the final line."""

    def __init__(self, mode: str, interval: float = 1.0) -> None:
        self.mode, self.interval, self._at = mode, interval, float("-inf")

    def emit(self, fields: Mapping[str, Any]) -> None:
        if time.monotonic() - self._at >= self.interval:
            self._at = time.monotonic()
            emit_json(self.mode, fields)


def emit_json(mode: str, result: Any, *, omit: Collection[str] = ()) -> None:
    """`result` (a dataclass, or a dict) as one JSON object after `schema_version` and `mode`,
    its fields in order, those in `omit` left out."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    else:
        fields = dict(result)
    body = {"schema_version": SCHEMA_VERSION, "mode": mode}
    body.update((k, v) for k, v in fields.items() if k not in omit)
    sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


def main(
    app: typer.Typer, prog: str, argv: list[str] | None = None, *, help_without_args: bool = False
) -> NoReturn:
    """Run `app` and turn every outcome into an exit code with at most one line of error."""
    args = sys.argv[1:] if argv is None else argv
    try:
        # Non-standalone: typer returns an explicit exit code (e.g. 0 after --help) and
        # raises usage errors to us instead of printing a multi-line panel.
        if help_without_args and not args:
            args = ["--help"]
        code = app(args=args, prog_name=prog, standalone_mode=False)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except (typer.Abort, KeyboardInterrupt):
        _fail(prog, "interrupted", INTERRUPTED, args)
    except Interrupted as stopped:
        _fail(prog, f"interrupted: {stopped}", INTERRUPTED, args)
    except typer.TyperException as exc:  # usage errors carry exit_code 2
        _fail(prog, exc.format_message(), exc.exit_code, args)
    except SystemExit:
        raise
    except Exception as raised:
        # A task group (the worker's service) wraps what its task raised: name that.
        error = sole_error(raised)
        if isinstance(error, UsageError | ValidationError | ConfigError):
            _fail(prog, str(error), 2, args)
        if _debug():
            raise
        if isinstance(error, OutboxError):
            _fail(prog, str(error), 1, args)
        if db.database_error(error) or isinstance(error, OSError):
            _fail(prog, f"{type(error).__name__}: {error}", 1, args)
        unexpected = f"unexpected {type(error).__name__}: {error} (set OUTBOX_LOG_LEVEL=debug)"
        _fail(prog, unexpected, 1, args)
    if code == INTERRUPTED:  # typer turns a KeyboardInterrupt into a silent Exit(130)
        _fail(prog, "interrupted", INTERRUPTED, args)
    raise SystemExit(code if isinstance(code, int) else 0)
