"""The README's configuration table names every setting the code reads."""

from __future__ import annotations

from helpers import ROOT
from outbox.config import FIELDS, Settings

README = (ROOT / "README.md").read_text()


def test_readme_lists_every_setting_with_its_default() -> None:
    defaults = Settings()
    for name, spec in FIELDS.items():
        row = next((ln for ln in README.splitlines() if ln.startswith(f"| `{spec.env}` |")), None)
        assert row is not None, f"README lacks {spec.env}"
        value = getattr(defaults, name)
        if value is not None:
            shown = (
                str(value).lower()
                if isinstance(value, bool)
                else f"{value:g}"
                if isinstance(value, float)
                else str(value)
            )
            assert f"`{shown}`" in row, f"README default of {spec.env} should be {shown}"


def test_readme_gives_the_two_commands() -> None:
    assert "make demo" in README
    assert "make test" in README
