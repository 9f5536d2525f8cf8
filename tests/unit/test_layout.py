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


def test_each_public_name_loads_on_first_use_and_append_stays_the_function() -> None:
    """`import outbox` is light (the console scripts hold their signals before the tools'
    imports, `outbox._entry`); a name loads on first use, and importing the append's own
    modules (the subpackage `outbox.append`) never replaces `outbox.append`, the function."""
    import subprocess
    import sys

    probe = (
        "import sys, outbox\n"
        "assert 'asyncpg' not in sys.modules and 'outbox.db' not in sys.modules\n"
        "import outbox.append.journal, outbox.cli.worker\n"
        "from outbox import append\n"
        "assert callable(outbox.append) and outbox.append is append, outbox.append\n"
        "assert outbox.Event.__module__ == 'outbox.model' and outbox.db.__name__ == 'outbox.db'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert callable(outbox.append)
