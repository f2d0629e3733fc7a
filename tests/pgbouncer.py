"""A real PgBouncer in transaction pooling mode in front of the test Postgres.

The Debian package ``pgbouncer`` provides the binary (CI installs it in ``.ci/run``). It
listens on a free loopback TCP port, authenticates clients with SCRAM against a userlist
holding the test server's own user and password, and reaches the server as the tests do:
the embedded Postgres over its unix socket directory, or ``$DATABASE_URL``'s host and port.
PgBouncer refuses to run as root: when we are root it runs as the owner of the server's
socket directory (who can reach the socket), or ``nobody`` for a TCP server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# PgBouncer needs a password to run SCRAM with its clients; the embedded server trusts its
# socket and never asks for it.
_DEFAULT_PASSWORD = "lgd-bouncer"


class PgBouncerUnavailable(RuntimeError):
    """The pgbouncer binary is not installed (or would not start)."""


def find_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        raise PgBouncerUnavailable(
            "no pgbouncer binary on PATH or in /usr/sbin (apt-get install pgbouncer)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """``PgBouncer(server_dsn).start()``; ``dsn_for(database_dsn)`` routes through it."""

    def __init__(self, server_dsn: str, pool_mode: str = "transaction", pool_size: int = 8):
        self.server = conninfo_to_dict(server_dsn)
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.user = str(self.server.get("user") or "postgres")
        self.password = str(self.server.get("password") or _DEFAULT_PASSWORD)
        self.port = 0
        self.dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _account(self, host: str) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        if host.startswith("/"):
            st = Path(host).stat()
            return st.st_uid, st.st_gid
        import pwd

        nobody = pwd.getpwnam("nobody")
        return nobody.pw_uid, nobody.pw_gid

    def start(self) -> PgBouncer:
        binary = find_binary()
        host = str(self.server.get("host") or "/var/run/postgresql")
        server_port = str(self.server.get("port") or 5432)
        self.dir = Path(tempfile.mkdtemp(prefix="lgd-pgbouncer-"))
        self.port = _free_port()
        (self.dir / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {self.dir}/userlist.txt
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
"""
        )
        account = self._account(host)
        extra: dict[str, Any] = {}
        if account is not None:
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, *account)
            extra = {"user": account[0], "group": account[1], "extra_groups": []}
        self.process = subprocess.Popen(
            [binary, str(self.dir / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **extra,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(self.dsn_for(""), connect_timeout=2):
                    return self
            except psycopg.OperationalError as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.log()
                    self.stop()
                    raise PgBouncerUnavailable(f"pgbouncer did not start: {exc}\n{log}") from exc
                time.sleep(0.1)

    def dsn_for(self, database_dsn: str) -> str:
        """The DSN reaching ``database_dsn``'s database through the bouncer."""
        dbname = conninfo_to_dict(database_dsn).get("dbname") if database_dsn else None
        return make_conninfo(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=dbname or self.server.get("dbname") or "postgres",
        )

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text()[-3000:] if self.dir else ""
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
