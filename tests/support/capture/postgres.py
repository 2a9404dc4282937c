"""A private PostgreSQL cluster for change-capture tests, and the session fixture that owns it.

The cluster lives in a fresh directory under the system temp dir, listens on 127.0.0.1 on a
free port (its socket in its own directory), runs with `wal_level=logical` and trust auth,
and is stopped with `pg_ctl stop` at the end of the session whatever happened. initdb refuses
to run as root, so as root the server-side commands run as the `postgres` user.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from connectors.kafka.local_broker import free_port

PG_ROOT = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"
SUPERUSER = "postgres"
DATABASE = "capture"
# A zone away from UTC, so that timestamptz values really are converted on the way through.
SERVER_TIMEZONE = "America/New_York"
START_TIMEOUT_S = 60
SLOT_DROP_TIMEOUT_S = 20.0
# Durability is pointless for a throw-away cluster; these keep the workload fast.
SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_wal_senders": "4",
    "max_replication_slots": "4",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "timezone": f"'{SERVER_TIMEZONE}'",
}


def pg_bindir() -> Path | None:
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql that has pg_ctl."""
    found = [p.parent for p in PG_ROOT.glob("*/bin/pg_ctl")]
    version = lambda path: int(re.sub(r"\D", "", path.parent.name) or 0)  # noqa: E731
    return max(found, key=version) if found else None


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


@dataclass
class PostgresCluster:
    """One private cluster: `start`, `execute`, `run_file`, `stop`."""

    bindir: Path
    base: Path
    port: int

    @property
    def data_dir(self) -> Path:
        """PGDATA."""
        return self.base / "data"

    @property
    def log_file(self) -> Path:
        """The server log."""
        return self.base / "server.log"

    def conninfo(self, dbname: str = DATABASE) -> str:
        """libpq connection string (TCP, trust auth)."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    def start(self) -> None:
        """initdb, configure, start and wait; then create the test database."""
        socket_dir = self.base / "socket"
        socket_dir.mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_USER)
            for path in (self.base, socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync"]
        _run(_as_server_user(initdb), "initdb")
        settings = {**SERVER_SETTINGS, "port": str(self.port), "unix_socket_directories": f"'{socket_dir}'"}
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self._pg_ctl("start", "-l", str(self.log_file), "-t", str(START_TIMEOUT_S))
        self.execute(f"CREATE DATABASE {DATABASE}", dbname="postgres")

    def stop(self) -> None:
        """Fast shutdown, waiting for it."""
        self._pg_ctl("stop", "-m", "fast")

    def _pg_ctl(self, action: str, *args: str) -> None:
        _run(_as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-w", *args, action]),
             f"pg_ctl {action} (server log: {self.log_file})")

    def execute(self, sql: str, dbname: str = DATABASE) -> list[tuple]:
        """Run one statement in autocommit mode; the rows it returns, if any."""
        with psycopg.connect(self.conninfo(dbname), autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def run_file(self, path: Path, dbname: str = DATABASE) -> None:
        """Run an SQL script with psql (statements autocommit unless the script says BEGIN)."""
        _run([str(self.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.conninfo(dbname),
              "-f", str(path)], f"psql -f {path.name}")

    def drop_replication_slot(self, slot: str, timeout: float = SLOT_DROP_TIMEOUT_S) -> None:
        """Drop a logical slot, retrying while its walsender lets go of it; absent is fine."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             f"WHERE slot_name = '{slot}'")
                return
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A running private cluster with `wal_level=logical` for the whole test session."""
    bindir = pg_bindir()
    if bindir is None:
        pytest.fail(f"no PostgreSQL under {PG_ROOT}/*/bin: run `bash scripts/install.sh test`")
    cluster = PostgresCluster(bindir, Path(tempfile.mkdtemp(prefix="cdc-pg-")), free_port())
    try:
        cluster.start()
        yield cluster
    finally:
        if (cluster.data_dir / "postmaster.pid").exists():
            cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)
