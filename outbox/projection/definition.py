"""A projector's definition: what decides what it owes and how it is guarded (S33).

A registration's definition is the set of fields that decide which events a projector owes
and how an event is kept from being applied twice or skipped: its subscribed types, its guard
(ordered, idempotent), its kind (per event, batch, SQL, lease), whether it runs in the
queue's transaction, where it starts, and a SQL projector's function. The database records
the definition of each (name, version) with the projector (S23), with a short fingerprint of
it. A worker whose definition of a recorded projector differs is refused at start
(`DefinitionDrift`): a change that alters what a projector owes ships as a new version (S29).
A change that does not (`SAFE_FIELDS`) may be recorded in place by an operator, audited
(`maintenance projector-redefine`).

Hooks (reset, drop), `promote` and the function's code are not part of the definition: they
change nothing of what is owed or how it is guarded. No I/O happens here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from outbox.config.fields import DEFAULT_GROUP
from outbox.errors import ConfigError

if TYPE_CHECKING:
    from outbox.projection.registry import Projector

__all__ = [
    "FIELDS",
    "SAFE_FIELDS",
    "Change",
    "DefinitionDrift",
    "changes",
    "check",
    "definition",
    "fingerprint",
    "legacy_definition",
]

# The definition's fields, in the order a drift names them.
FIELDS = (
    "events",
    "ordered",
    "idempotent",
    "kind",
    "transactional",
    "start",
    "function",
    "group",
)
# The worker group that serves a projector (S35) is part of its definition only outside the
# default group: every record made before groups, and every projector served in the default
# group, keeps its fingerprint. A record without it is the default group's (DEFAULT_GROUP).
# The fields a change of which leaves what the projector owes and its guard as they are: where
# it starts counts once, when it is first recorded (S25); per event, batch and SQL are three
# ways of calling a transactional projector under the same guard on the same track, and the
# function is its code (a Python projector's code is not recorded either). Every other change
# (types, guard, lease mode) ships as a new version.
SAFE_FIELDS = frozenset({"kind", "start", "function"})
# Kinds a change between which is safe: each runs in the queue's transaction (lease mode does
# not, and its change is a change of `transactional` too).
_TRANSACTIONAL_KINDS = frozenset({"event", "batch", "sql"})

Definition = dict[str, Any]


def definition(projector: Projector, group: str = DEFAULT_GROUP) -> Definition:
    """`projector`'s definition, as recorded, served in worker group `group` (S35)."""
    if not projector.transactional:
        kind = "lease"
    elif projector.sql is not None:
        kind = "sql"
    else:
        kind = "batch" if projector.batch else "event"
    found: Definition = {
        "events": sorted(projector.events),
        "ordered": projector.ordered,
        # Markers guard an unordered projector only: an ordered one has its checkpoint.
        "idempotent": projector.idempotent and not projector.ordered,
        "kind": kind,
        "transactional": projector.transactional,
        "start": projector.start,
        "function": None if projector.sql is None else f"{projector.sql.function}(jsonb)",
    }
    if group != DEFAULT_GROUP:
        found["group"] = group
    return found


def fingerprint(document: Mapping[str, Any]) -> str:
    """A short, stable digest of a definition (key order does not matter), to compare at a
    glance across workers and the record."""
    return hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


def legacy_definition(events: Sequence[str], ordered: bool, transactional: bool) -> Definition:
    """What a record from before definitions (a worker of an earlier release wrote it) says of
    a projector: the fields it kept; the others are taken from the first worker of this
    release that records the projector."""
    return {"events": sorted(events), "ordered": ordered, "transactional": transactional}


@dataclass(frozen=True, slots=True)
class Change:
    """One field of a definition changed: the recorded value and this worker's."""

    field: str
    recorded: Any
    mine: Any

    @property
    def safe(self) -> bool:
        """Whether the change leaves what the projector owes and its guard as they are."""
        if self.field == "kind":
            return {self.recorded, self.mine} <= _TRANSACTIONAL_KINDS
        return self.field in SAFE_FIELDS

    def describe(self) -> str:
        return f"{self.field} {_shown(self.recorded)} -> {_shown(self.mine)}"


def changes(recorded: Mapping[str, Any], mine: Mapping[str, Any]) -> list[Change]:
    """The fields whose values differ, in `FIELDS` order; a field the record lacks (a record
    from before definitions) is not compared, but for the group, which is the default one
    where a definition does not name it."""
    found = [
        Change(name, recorded[name], mine.get(name))
        for name in FIELDS
        if name != "group" and name in recorded and recorded[name] != mine.get(name)
    ]
    groups = recorded.get("group", DEFAULT_GROUP), mine.get("group", DEFAULT_GROUP)
    if groups[0] != groups[1]:
        found.append(Change("group", *groups))
    return found


class DefinitionDrift(ConfigError):
    """A worker's definition of a recorded projector differs from the record: it is refused
    before it writes anything (one line: the projector, each field recorded -> this worker's,
    and what to do)."""

    def __init__(self, drifts: Sequence[tuple[str, int, int, Sequence[Change]]]) -> None:
        """`drifts`: (the projector's key, its version, the next version free for its name,
        the changes from the record to this worker's definition)."""
        self.drifts = {name: list(found) for name, _, _, found in drifts}
        parts = []
        for name, version, free, found in drifts:
            shown = "; ".join(c.describe() for c in found)
            ship = f"ship it as version {free} (built beside, then promoted)"
            if all(c.safe for c in found):
                redefine = f"maintenance projector-redefine {_base(name, version)}" + (
                    f" --version {version}" if version > 1 else ""
                )
                remedy = f"record it with `{redefine} --app ...` (safe in place), or {ship}"
            else:
                remedy = ship
            parts.append(f"projector {name!r} differs from its record ({shown}): {remedy}")
        super().__init__(
            "; ".join(parts) + "; or run the recorded definition (this worker wrote nothing)"
        )


def _base(name: str, version: int) -> str:
    return name if version == 1 else name.removesuffix(f"@v{version}")


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check(projector: str, recorded: Mapping[str, Any], mine: Mapping[str, Any]) -> list[Change]:
    """The changes from `recorded` to `mine` for an operator's redefinition: refused (a
    ConfigError saying to ship a version) when any is not safe in place."""
    found = changes(recorded, mine)
    unsafe = [c for c in found if not c.safe]
    if unsafe:
        shown = "; ".join(c.describe() for c in unsafe)
        raise ConfigError(
            f"projector {projector!r}: {shown} changes what it owes or how it is guarded: "
            "ship it as a new version (built beside, then promoted), not in place"
        )
    return found
