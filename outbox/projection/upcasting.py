"""Events that evolve: upcasters turn an event's payload from the version it was appended at
to the next, so projectors see every event at the newest version the app's upcasters reach.

An app registers `@app.upcaster("clicked", from_version=1)` (`fn(payload) -> payload`, version
1 to 2); chains compose (1 -> 2 -> 3). `Upcasters.apply` is called where every Python
projector receives its events (`Projector.run`: live batches, inline apply, heals and
catch-ups, builds and rebuilds, requeues and replays, lease mode), so each path upcasts the
same way; it costs nothing when no event of the batch is behind. An upcaster that raises fails
the event for the projector being run (its track, S24), naming the upcaster. SQL projectors
take SQL upcasters (`app.sql_upcaster`), run by the server in the call (`sql_upcasting`).
No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.errors import ConfigError, UpcastFailed
from outbox.model import EventBatch

__all__ = ["UpcastFailed", "Upcaster", "UpcasterFn", "Upcasters"]

# A payload of one version made into the next version's.
UpcasterFn = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Upcaster:
    """Turns `event_type`'s payload from `from_version` to the next: a Python function
    (`fn`) or a SQL function (`function`, `jsonb -> jsonb`) for SQL projectors."""

    event_type: str
    from_version: int
    fn: UpcasterFn | None = None
    function: str | None = None

    @property
    def name(self) -> str:
        """How `last_error` and refusals name it."""
        if self.function is not None:
            return self.function
        fn = self.fn
        return getattr(fn, "__qualname__", None) or repr(fn)

    def describe(self) -> str:
        return (
            f"upcaster {self.name} ({self.event_type} v{self.from_version} -> "
            f"v{self.from_version + 1})"
        )


@dataclass
class Upcasters:
    """An app's upcasters, Python and SQL, by event type and the version each starts from.
    One instance is shared by the app's registry and its projectors (registered later ones
    included)."""

    python: dict[str, dict[int, Upcaster]] = field(default_factory=dict)
    sql: dict[str, dict[int, Upcaster]] = field(default_factory=dict)
    # sql_chains' answers by the types asked (a SQL projector asks on every call)
    _chains: dict[frozenset[str], dict[str, dict[str, str]]] = field(
        default_factory=dict, repr=False
    )

    def add(self, upcaster: Upcaster) -> None:
        version = upcaster.from_version
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigError(
                f"upcaster of {upcaster.event_type!r}: from_version must be a whole number "
                f"from 1, not {version!r}"
            )
        if not isinstance(upcaster.event_type, str) or not upcaster.event_type.strip():
            raise ConfigError("an upcaster needs a non-empty event type")
        chains = self.sql if upcaster.function is not None else self.python
        chain = chains.setdefault(upcaster.event_type, {})
        if version in chain:
            kind = "SQL upcaster" if upcaster.function is not None else "upcaster"
            raise ConfigError(
                f"{kind} of {upcaster.event_type!r} from version {version} registered twice"
            )
        chain[version] = upcaster
        self._chains.clear()

    def __bool__(self) -> bool:
        return bool(self.python)

    def newest(self, event_type: str, version: int) -> int:
        """The version an event of `event_type` at `version` reaches through the Python
        upcasters."""
        chain = self.python.get(event_type)
        while chain and version in chain:
            version += 1
        return version

    def apply(self, batch: EventBatch) -> EventBatch:
        """`batch` with each event behind its newest version upcast to it (a new batch; the
        same one when none is behind). UpcastFailed names the upcaster, the event and why."""
        python = self.python
        behind = [
            i
            for i, (t, v) in enumerate(zip(batch.types, batch.versions, strict=True))
            if t in python and v in python[t]
        ]
        if not behind:
            return batch
        payloads, versions = list(batch.payloads), list(batch.versions)
        for i in behind:
            chain = python[batch.types[i]]
            payload, version = payloads[i], versions[i]
            while version in chain:
                upcaster = chain[version]
                try:
                    payload = upcaster.fn(payload)  # type: ignore[misc]
                except Exception as exc:
                    raise UpcastFailed(
                        f"{upcaster.describe()} failed on {batch.campaign_ids[i]!r} seq "
                        f"{batch.seqs[i]}: {type(exc).__name__}: {exc}"
                    ) from exc
                version += 1
            payloads[i], versions[i] = payload, version
        return EventBatch(
            batch.campaign_ids,
            batch.seqs,
            batch.types,
            payloads,
            batch.metadata,
            batch.recorded_at,
            versions,
        )

    def sql_chains(self, types: frozenset[str]) -> dict[str, dict[str, str]]:
        """The SQL upcasters of `types`, as the server's call takes them: {type: {from
        version: function}} (empty: none)."""
        found = self._chains.get(types)
        if found is None:
            found = self._chains[types] = {
                t: {str(v): u.function or "" for v, u in sorted(self.sql[t].items())}
                for t in sorted(types)
                if t in self.sql
            }
        return found

    def check_sql(self, projector: str, types: frozenset[str]) -> None:
        """A SQL projector of `types` is refused when one of them has Python upcasters its SQL
        upcasters do not match version for version: the server could not upcast its events."""
        for t in sorted(types):
            python: Mapping[int, Upcaster] = self.python.get(t, {})
            sql: Mapping[int, Upcaster] = self.sql.get(t, {})
            lacking = sorted(set(python) - set(sql))
            if lacking:
                versions = ", ".join(f"v{v} -> v{v + 1}" for v in lacking)
                raise ConfigError(
                    f"SQL projector {projector!r} takes {t!r}, whose upcaster {versions} is "
                    f"Python only: register app.sql_upcaster({t!r}, from_version="
                    f"{lacking[0]}, function=...) for it"
                )
