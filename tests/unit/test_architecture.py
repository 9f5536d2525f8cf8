"""docs/architecture.md lists every module of the package and every SQL file, and names none
that is gone: a newcomer's map of the code is the code."""

from __future__ import annotations

import re

from helpers import ROOT

DOC = (ROOT / "docs" / "architecture.md").read_text()
# Each listed file is a table row's first cell: | `outbox/...` | (or a range of migrations).
LISTED = set(re.findall(r"^\| `((?:outbox|sql)/[^`]+)`", DOC, re.M))


def _files() -> set[str]:
    found = {
        str(f.relative_to(ROOT))
        for f in [*(ROOT / "outbox").rglob("*.py"), *(ROOT / "outbox").rglob("*.sql")]
        if "__pycache__" not in f.parts
    }
    return found | {str(f.relative_to(ROOT)) for f in (ROOT / "sql").glob("*.sql")}


def test_every_module_and_sql_file_has_its_line() -> None:
    released = {f"sql/000{n}_" for n in (1, 2, 3)}  # 0.1.0's files: one line for the three
    missing = {f for f in _files() - LISTED if not any(f.startswith(r) for r in released)}
    assert missing == set()


def test_every_listed_file_exists() -> None:
    assert {f for f in LISTED if not (ROOT / f).exists()} == set()
