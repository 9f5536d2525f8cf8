"""The campaigns domain: event types and a deterministic stream of demo events.

A campaign is created, characters join and leave, notes are added, dice are rolled. One event
type, `dice.cursed`, exists to fail: its projector (see the worker issue) raises, so the demo
and the tests always have something to dead-letter.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from outbox.model import Event

__all__ = ["CAMPAIGN_CREATED", "EVENT_TYPES", "DemoStream", "campaign_ids"]

CAMPAIGN_CREATED = "campaign.created"
CHARACTER_JOINED = "character.joined"
CHARACTER_LEFT = "character.left"
NOTE_ADDED = "note.added"
DICE_ROLLED = "dice.rolled"
DICE_CURSED = "dice.cursed"
EVENT_TYPES = (
    CAMPAIGN_CREATED,
    CHARACTER_JOINED,
    CHARACTER_LEFT,
    NOTE_ADDED,
    DICE_ROLLED,
    DICE_CURSED,
)

_NAMES = ("Ada", "Brom", "Cyra", "Dain", "Eluned", "Fenn", "Gwyn", "Hale", "Iona", "Jory")


def campaign_ids(count: int) -> list[str]:
    return [f"campaign-{i:04d}" for i in range(count)]


@dataclass
class DemoStream:
    """Deterministic batches of events per campaign; `cursed_every` controls the failures."""

    seed: int = 7
    cursed_every: int = 0  # 0: never; n: roughly one cursed roll in n events

    def batches(self, campaign_id: str, events: int, batch: int = 5) -> Iterator[list[Event]]:
        rng = random.Random(f"{self.seed}:{campaign_id}")  # noqa: S311 - demo data, not secrets
        members: set[str] = set()
        produced = 0
        pending: list[Event] = [Event(CAMPAIGN_CREATED, {"name": campaign_id.title()})]
        produced += 1
        while produced < events:
            pending.append(self._next(rng, members))
            produced += 1
            if len(pending) >= batch:
                yield pending
                pending = []
        if pending:
            yield pending

    def _next(self, rng: random.Random, members: set[str]) -> Event:
        if self.cursed_every and rng.randrange(self.cursed_every) == 0:
            return Event(DICE_CURSED, {"sides": 13})
        roll = rng.random()
        if roll < 0.25 or not members:
            name = rng.choice(_NAMES)
            members.add(name)
            return Event(CHARACTER_JOINED, {"character": name, "class": rng.choice("FWRC")})
        if roll < 0.35 and len(members) > 1:
            name = rng.choice(sorted(members))
            members.discard(name)
            return Event(CHARACTER_LEFT, {"character": name})
        if roll < 0.7:
            return Event(NOTE_ADDED, {"text": f"note {rng.randrange(10_000)}"})
        return Event(DICE_ROLLED, {"sides": 20, "value": rng.randint(1, 20)})
