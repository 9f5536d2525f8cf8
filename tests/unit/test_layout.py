"""The layout's promises, checked: small modules that say what they own, one public API."""

from __future__ import annotations

import ast

import outbox
from helpers import ROOT

MAX_LINES = 400
MODULES = sorted((ROOT / "outbox").rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(m.relative_to(ROOT)): n
        for m in MODULES
        if (n := len(m.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_module_says_what_it_owns() -> None:
    silent = [
        str(m.relative_to(ROOT))
        for m in MODULES
        if m.stat().st_size and not ast.get_docstring(ast.parse(m.read_text()))
    ]
    assert silent == []


def test_the_public_api_is_exactly_what_init_exports() -> None:
    assert sorted(outbox.__all__) == sorted(set(outbox.__all__))
    for name in outbox.__all__:
        assert getattr(outbox, name) is not None, name
    exported = {n for n in vars(outbox) if not n.startswith("_")}
    subpackages = {m.stem if m.name != "__init__.py" else m.parent.name for m in MODULES}
    assert exported - set(outbox.__all__) <= subpackages, "import what you export in __all__"
