"""A projectors file: SQL projectors declared with no Python at all.

`outbox-worker --projectors projectors.toml` (or `--app projectors.toml` on any command that
takes an app) runs the stock worker with the SQL projectors a TOML file lists:

    ignore = ["character.renamed"]            # optional: types that need no projection

    [[projector]]
    name = "roster"                           # required
    events = ["character.joined"]             # required: the types it subscribes to
    function = "app.apply_roster"             # required: fn(events jsonb)
    ordered = true                            # default true; false: no checkpoint
    idempotent = false                        # unordered only: a processed marker per event
    start = "beginning"                       # or "now" (default: ordered "beginning")
    version = 1                               # a later one is built beside the live one
    promote = "manual"                        # or "auto"
    reset = "app.reset_roster"                # optional: fn(campaign_id text), for rebuilds
    drop = "app.drop_roster"                  # optional: fn(), when a version is retired

Each entry is `app.sql_projector(**entry)`. Anything else in the file (an unknown key, a value
of the wrong type, a missing one) is a ConfigError naming the file, the entry and the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from outbox.config import Settings
from outbox.errors import ConfigError
from outbox.projection.app import Outbox

__all__ = ["load_projectors"]

# Each key an entry may have: its type, and whether it is required.
_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "name": (str, True),
    "events": (list, True),
    "function": (str, True),
    "ordered": (bool, False),
    "idempotent": (bool, False),
    "start": (str, False),
    "version": (int, False),
    "promote": (str, False),
    "reset": (str, False),
    "drop": (str, False),
}


def load_projectors(path: str | Path, settings: Settings | None = None) -> Outbox:
    """The app the projectors file at `path` declares (`settings`: the environment's)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the projectors file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: the projectors file is not UTF-8 text") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"projector", "ignore"})
    if unknown:
        raise ConfigError(
            f"{where}: unknown top-level key {unknown[0]!r} (expected [[projector]] and ignore)"
        )
    entries = document.get("projector", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: no projectors: add a [[projector]] table per projector")
    app = Outbox(settings)
    for index, entry in enumerate(entries):
        _declare(app, f"{where}: projector {index + 1}", entry)
    ignored = document.get("ignore", [])
    if not isinstance(ignored, list) or not all(isinstance(t, str) for t in ignored):
        raise ConfigError(f"{where}: ignore must be a list of event types")
    if ignored:
        try:
            app.ignore(ignored)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return app


def _declare(app: Outbox, where: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a [[projector]] table")
    if isinstance(entry.get("name"), str):
        where = f"{where} ({entry['name']!r})"
    for key, value in entry.items():
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (expected one of {', '.join(_KEYS)})")
        wanted, _ = _KEYS[key]
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: {key} must be a {_TYPE_NAMES[wanted]}, got {value!r}")
    for key, (_, required) in _KEYS.items():
        if required and key not in entry:
            raise ConfigError(f"{where}: {key} is required")
    if not all(isinstance(t, str) for t in entry["events"]):
        raise ConfigError(f"{where}: events must be a list of event types (strings)")
    try:
        app.sql_projector(**entry)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


_TYPE_NAMES: dict[type | tuple[type, ...], str] = {
    str: "string",
    list: "list",
    bool: "boolean (true or false)",
    int: "whole number",
}
