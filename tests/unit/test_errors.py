"""The exception tree drawn in outbox/errors.py is the tree the classes form, and the public
API exports every class of it."""

from __future__ import annotations

import re

import outbox
from outbox import errors


def _drawn() -> dict[str, str]:
    """class -> parent, as the module docstring draws them (indentation is depth)."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^(?P<lead>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)\b", line)
        if not found or found["name"] not in errors.__all__:
            continue
        depth = len(found["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[found["name"]] = stack[-1][1]
        stack.append((depth, found["name"]))
    return parents


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn = _drawn()
    assert set(drawn) == set(errors.__all__) - {"OutboxError"}
    for name, parent in drawn.items():
        cls = getattr(errors, name)
        assert getattr(errors, parent) in cls.__mro__[1:], f"{name} is drawn under {parent}"


def test_every_error_is_exported() -> None:
    assert set(errors.__all__) - {"LocalClusterError", "QueryFileError", "TransientBatchError"} <= (
        set(outbox.__all__) | {"UsageError"}
    )
