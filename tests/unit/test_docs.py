"""The docs match the code: the README names every setting; the semantics cite real tests."""

from __future__ import annotations

import re
import tomllib

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


def test_readme_says_what_make_test_runs_and_ci_runs_the_rest() -> None:
    """`make test` is the unit, integration and acceptance tiers: the fault tier is deselected
    by its marker and the Citus tier is collected only with --citus; each has a target of its
    own, which the README names and .ci/run runs after `make test`."""
    line = next(ln for ln in README.splitlines() if ln.startswith("make test "))
    assert "the unit, integration and acceptance tiers" in line
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert "-m 'not faults'" in options["ini_options"]["addopts"]
    assert "--citus" in (ROOT / "Makefile").read_text().split("\ntest-citus:")[1].split("\n\n")[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [ln for ln in ci if ln.startswith("make ")]
    assert [s.split()[1] for s in steps[:4]] == ["lint", "test", "test-faults", "test-citus"]
    assert all(f"`make {t}`" in README for t in ("test-faults", "test-citus"))


def test_every_test_the_semantics_cite_exists() -> None:
    """docs/semantics.md names the tests that check each rule: each name (or `prefix_*`) must
    be a test, each file one of the tests' files."""
    text = (ROOT / "docs" / "semantics.md").read_text()
    sources = {p.name: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    defined = set(re.findall(r"def (test_\w+)", "".join(sources.values())))
    for cited in re.findall(r"`(?:[\w/]+\.py::)?(test_\w+\*?)`", text):
        if cited.endswith("*"):
            assert any(d.startswith(cited[:-1]) for d in defined), cited
        else:
            assert cited in defined, cited
    for path in re.findall(r"`((?:\w+/)?test_\w+\.py)", text):
        assert path.rsplit("/", 1)[-1] in sources, path


def test_the_worker_docs_show_the_fastapi_example_as_it_is() -> None:
    """docs/worker.md carries docs/examples/fastapi_app.py verbatim (the tests run the file)."""
    example = (ROOT / "docs" / "examples" / "fastapi_app.py").read_text()
    assert f"```python\n{example}```" in (ROOT / "docs" / "worker.md").read_text()


def test_the_testing_docs_show_the_example_tests_as_they_are() -> None:
    example = (ROOT / "docs" / "examples" / "test_fastapi_app.py").read_text()
    assert f"```python\n{example}```" in (ROOT / "docs" / "testing.md").read_text()
