"""A throwaway PostgreSQL cluster for the tests: Debian's binaries, a temp dir, a free port.

`Cluster.start()` runs ``initdb`` in a fresh temporary directory and
``pg_ctl start`` on 127.0.0.1 with the unix socket in that directory, trust
authentication and superuser ``postgres``; `Cluster.stop()` stops it and
removes the directory; `Cluster.new_dsn()` gives each test an empty schema
of its own. Nothing here touches a cluster the ``postgresql`` package may
have started on port 5432. ``WEBAPP_PG_BIN`` names the binaries' folder
where they are not in Debian's place.

PostgreSQL refuses to run as root, so when the tests run as root every
server command runs as the ``postgres`` user (``runuser -u postgres --``),
which owns the directory. ``durable=False`` (the tests' default) turns fsync
off: the tests kill clients, never the server or the machine, so nothing they
check depends on it, and it makes commits much cheaper.
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

T = TypeVar("T")

SUPERUSER = "postgres"
TEST_DATABASE = "tests"


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries (or no user to run them as) on this machine."""


class ClusterError(RuntimeError):
    """A server command failed; the message holds its output and the server log."""


def missing_postgres(reason: str) -> NoReturn:
    """Skip the test that needs PostgreSQL -- or, under CI=true, fail it: CI skips nothing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}. CI=true: the PostgreSQL tests must run, not be skipped.")
    pytest.skip(reason)


def find_bin_dir(search: str = "/usr/lib/postgresql/*/bin") -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding initdb and pg_ctl."""
    override = os.environ.get("WEBAPP_PG_BIN")
    candidates = [override] if override else []

    def version(path: str) -> tuple[int, ...]:
        found = re.search(r"/postgresql/([\d.]+)/bin", path)
        return tuple(int(p) for p in found.group(1).split(".")) if found else (0,)

    found = sorted(glob.glob(search), key=version, reverse=True)
    candidates += found
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    raise NoPostgres(
        "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on "
        "PATH; install them with `apt-get install -y postgresql` (or set WEBAPP_PG_BIN)"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """One throwaway PostgreSQL server; ``dsn(dbname)`` connects to one of its databases."""

    durable: bool = False
    bin_dir: Path = field(default_factory=find_bin_dir)
    root: Path | None = None
    port: int = 0
    _admin: Admin | None = None
    _names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def start(self) -> Cluster:
        as_root = os.geteuid() == 0
        if as_root:
            try:
                owner = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise NoPostgres(
                    "running as root, but there is no 'postgres' user to run the server as "
                    "(Debian's postgresql package creates it)"
                ) from None
        # Directly under /tmp: pytest's own temp dirs are private to root, the
        # postgres user could not reach them, and a socket path must stay short.
        self.root = Path(tempfile.mkdtemp(prefix="webapp-pg-"))
        try:
            if as_root:
                os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._init_and_start()
        except BaseException:
            self.stop()
            raise
        return self

    def _init_and_start(self) -> None:
        assert self.root is not None
        data = self.root / "data"
        self._run(
            "initdb",
            "-D", str(data),
            "-U", SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )  # fmt: skip
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "max_connections": "300",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        options = " ".join(f"-c {k}={v}" for k, v in settings.items())
        for attempt in range(3):  # another process may take the free port first
            self.port = free_port()
            try:
                self._run(
                    "pg_ctl", "start", "-w", "-t", "60",
                    "-D", str(data),
                    "-l", str(self.root / "server.log"),
                    "-o", f"-p {self.port} {options}",
                )  # fmt: skip
                return
            except ClusterError:
                if attempt == 2:
                    raise

    def new_dsn(self) -> str:
        """A DSN whose tables are its own: a new schema, first and only on its search_path.

        A schema rather than a database: CREATE SCHEMA takes a millisecond,
        CREATE DATABASE copies a template (0.1-1 s on a busy machine, and the
        disk to delete at the end).
        """
        if self._admin is None:
            admin = Admin(self.dsn())
            admin.execute(f"CREATE DATABASE {TEST_DATABASE}")
            admin.close()
            self._admin = Admin(self.dsn(TEST_DATABASE))
        name = f"test_{next(self._names)}"
        self._admin.execute(f"CREATE SCHEMA {name}")
        # asyncpg sends unknown URL parameters as settings for the session.
        return f"{self.dsn(TEST_DATABASE)}?search_path={name}"

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.root is None:
            return
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(self.root / "data"))
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        path = (self.root or Path("/nonexistent")) / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no server log)"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.root,
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                f"server log:\n{self.log()}"
            )


class Admin:
    """One superuser connection on a thread of its own, for the fixtures' synchronous code.

    Its own thread and event loop, so it never meets the tests' event loops.
    """

    def __init__(self, dsn: str) -> None:
        import asyncpg

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._conn = self._call(asyncpg.connect(dsn))

    def execute(self, sql: str, *args: object) -> str:
        return self._call(self._conn.execute(sql, *args))  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            self._call(self._conn.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)
