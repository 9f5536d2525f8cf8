"""The journal range a campaign's claimed seqs need for its ordered checkpoints (pure)."""

from __future__ import annotations

import pytest

from outbox.projection.heal import _wanted


@pytest.mark.parametrize(
    ("seqs", "checkpoints", "wanted"),
    [
        ([5, 6, 7], [4, 4], None),  # level: nothing to read
        ([5, 6, 7], [7, 9], None),  # every checkpoint past the claimed seqs: duplicates
        ([5, 6, 7], [4, 0], (1, 4)),  # a new projector: the history before the first row
        ([5, 6, 7], [2, 4], (3, 4)),  # the lowest checkpoint sets the start
        ([5, 7, 9], [4], (6, 8)),  # rows deleted between claimed ones
        ([5, 7], [6], None),  # ... but not for a projector already past the hole
        ([5, 7], [3, 6], (4, 6)),  # one projector lacks 4 and 6, the other nothing
        ([5, 8], [0, 6], (1, 7)),  # from the newest projector's start to the last hole
    ],
)
def test_the_range_runs_from_the_lowest_lacking_seq_to_the_highest(
    seqs: list[int], checkpoints: list[int], wanted: tuple[int, int] | None
) -> None:
    assert _wanted(seqs, checkpoints) == wanted
