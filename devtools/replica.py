"""A primary and a streaming standby on this machine, and a failover between them.

:func:`start_replica_pair` runs two private PostgreSQL servers from the machine's binaries
(the ``system`` backend of :mod:`devtools.postgres`; as the OS user ``lgd_postgres`` when
this process is root), each listening only on a unix socket in a directory of its own:

* the primary, ``initdb`` once per process (later pairs copy that cluster);
* the standby, made with ``pg_basebackup -R`` from the primary and streaming from it.

``mode="sync"`` names the standby in the primary's ``synchronous_standby_names``: a commit
that waits for its WAL flush (``synchronous_commit`` on, the default) returns only once
the standby has flushed it too. ``mode="async"``: commits return once flushed locally.

``lag_ms`` puts a delay proxy (``benchmarks/delay_proxy.py``) on the replication
connection, so the standby receives the WAL ``lag_ms / 2`` after it was sent.
:meth:`ReplicaPair.failover` first cuts that connection (what it still carried is lost, as
in a network partition), then stops the primary with ``pg_ctl stop -m immediate`` and
promotes the standby (``pg_ctl promote``). Under ``async`` the WAL the standby had not
received is gone: writes acknowledged by the old primary are lost. ``recovery_min_apply_delay``
would not do this: it delays replay, not receipt, and promotion replays what was received.

Clients use :attr:`ReplicaPair.dsn`: both hosts in one conninfo with
``target_session_attrs=read-write``, so libpq connects to whichever is the primary.
Test machinery, not part of the wheel.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import psycopg
from psycopg import sql

from devtools.postgres import _find_binaries, _run, _service_account, _tail
from langgraph_deterministic.embedded import SUPERUSER
from langgraph_deterministic.errors import DatabaseUnavailableError

Mode = Literal["sync", "async"]

_PORT: Final = 5432  # names the socket file only: no TCP listener
_TIMEOUT_S: Final = 60
STANDBY_NAME: Final = "lgd_standby"

_template_lock = threading.Lock()
_template: Path | None = None


def _chown_tree(path: Path, account: tuple[int, int] | None) -> None:
    if account is None:
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, *account)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), *account)


def _initdb_template(bindir: Path, account: tuple[int, int] | None) -> Path:
    """One initdb per process; each pair copies it (initdb costs ~1 s, a copy ~50 ms)."""
    global _template
    with _template_lock:
        if _template is not None and (_template / "PG_VERSION").exists():
            return _template
        scratch = Path(tempfile.mkdtemp(prefix="lgd-ha-template-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        scratch.chmod(0o755)
        data = scratch / "data"
        data.mkdir(mode=0o700)
        _chown_tree(scratch, account)
        code, out = _run(
            [str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-sync"],
            account, scratch,
        )  # fmt: skip
        if code != 0:
            raise DatabaseUnavailableError(f"initdb failed ({code}): {out[-1500:]}")
        with (data / "postgresql.conf").open("a") as conf:
            # Fast to start and stop; small WAL; hot standby for read-only checks.
            conf.write(
                "\nlisten_addresses = ''\nport = 5432\nmax_wal_senders = 5\n"
                "wal_level = replica\nhot_standby = on\nfsync = off\n"
                "full_page_writes = on\nshared_buffers = 32MB\nmax_connections = 60\n"
                "wal_sender_timeout = 5s\nwal_receiver_timeout = 5s\n"
                "wal_receiver_status_interval = 1s\n"
            )
        _template = data
        return data


@dataclass
class ReplicaPair:
    """A running primary and standby; see the module docstring."""

    mode: Mode
    lag_ms: float
    root: Path
    bindir: Path
    account: tuple[int, int] | None
    dbname: str = "postgres"
    promoted: bool = False
    _proxy: Any = None
    _stopped: bool = False
    log: list[str] = field(default_factory=list)

    # -- layout ----------------------------------------------------------------------

    @property
    def primary_data(self) -> Path:
        return self.root / "primary"

    @property
    def standby_data(self) -> Path:
        return self.root / "standby"

    @property
    def primary_socket(self) -> Path:
        return self.root / "sock-primary"

    @property
    def standby_socket(self) -> Path:
        return self.root / "sock-standby"

    def node_dsn(self, which: Literal["primary", "standby"], dbname: str | None = None) -> str:
        """A conninfo for one server alone (no failover)."""
        sock = self.primary_socket if which == "primary" else self.standby_socket
        return (
            f"host={sock} port={_PORT} user={SUPERUSER} dbname={dbname or self.dbname} "
            "connect_timeout=2"
        )

    @property
    def dsn(self) -> str:
        """Both hosts, ``target_session_attrs=read-write``: connects to the primary."""
        return multi_host_dsn(
            [str(self.primary_socket), str(self.standby_socket)], _PORT, self.dbname
        )

    # -- control ---------------------------------------------------------------------

    def _pg_ctl(self, data: Path, *args: str) -> tuple[int, str]:
        return _run([str(self.bindir / "pg_ctl"), "-D", str(data), *args], self.account, self.root)

    def _start(self, data: Path, socket_dir: Path, extra: str = "") -> None:
        options = f"-c unix_socket_directories='{socket_dir}' {extra}".strip()
        code, out = self._pg_ctl(
            data,
            "-l",
            str(data / "server.log"),
            "-w",
            "-t",
            str(_TIMEOUT_S),
            "-o",
            options,
            "start",
        )
        if code != 0:
            raise DatabaseUnavailableError(
                f"pg_ctl start failed in {data} ({code}): {out[-800:]}\n"
                f"{_tail(data / 'server.log')}"
            )

    def create_database(self, name: str) -> str:
        """Create ``name`` on the primary, wait until the standby has it; returns the pair's
        multi-host DSN for it (and makes it this pair's default database)."""
        with psycopg.connect(self.node_dsn("primary", "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.dbname = name
        self.wait_caught_up()
        return self.dsn

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has flushed."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.node_dsn("primary", "postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
            assert row is not None
            target = row[0]
        with psycopg.connect(self.node_dsn("standby", "postgres"), autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    raise DatabaseUnavailableError(
                        f"the standby did not catch up to {target} within {timeout} s"
                    )
                time.sleep(0.02)

    def failover(self) -> float:
        """Cut replication, stop the primary with ``-m immediate``, promote the standby.
        Returns the seconds from the primary's stop until the standby accepted writes."""
        if self._proxy is not None:  # the partition: what the link still carried is lost
            self._proxy.stop()
            self._proxy = None
        code, out = self._pg_ctl(self.primary_data, "-m", "immediate", "-w", "stop")
        if code != 0 and (self.primary_data / "postmaster.pid").exists():
            raise DatabaseUnavailableError(f"pg_ctl stop -m immediate failed ({code}): {out}")
        t0 = time.monotonic()
        code, out = self._pg_ctl(self.standby_data, "-w", "-t", str(_TIMEOUT_S), "promote")
        if code != 0:
            raise DatabaseUnavailableError(
                f"pg_ctl promote failed ({code}): {out}\n{_tail(self.standby_data / 'server.log')}"
            )
        self.promoted = True
        return time.monotonic() - t0

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        for data in (self.standby_data, self.primary_data):
            if (data / "postmaster.pid").exists():
                self._pg_ctl(data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicaPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def multi_host_dsn(hosts: list[str], port: int, dbname: str, **extra: Any) -> str:
    """A libpq conninfo naming every host, connecting to the one that takes writes."""
    params = {
        "host": ",".join(hosts),
        "port": ",".join(str(port) for _ in hosts),
        "user": SUPERUSER,
        "dbname": dbname,
        "target_session_attrs": "read-write",
        "connect_timeout": 2,
        **extra,
    }
    return " ".join(f"{k}={v}" for k, v in params.items())


def start_replica_pair(mode: Mode = "sync", *, lag_ms: float = 0.0) -> ReplicaPair:
    """Start a primary and a streaming standby (see the module docstring)."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
    bindir = _find_binaries()
    if not (bindir / "pg_basebackup").is_file():
        raise DatabaseUnavailableError(f"no pg_basebackup in {bindir}")
    account = _service_account()
    template = _initdb_template(bindir, account)
    root = Path(tempfile.mkdtemp(prefix="lgd-ha-"))
    root.chmod(0o755)
    pair = ReplicaPair(mode=mode, lag_ms=lag_ms, root=root, bindir=bindir, account=account)
    try:
        pair.primary_socket.mkdir()
        pair.standby_socket.mkdir()
        shutil.copytree(template, pair.primary_data, symlinks=True)
        pair.primary_data.chmod(0o700)
        _chown_tree(root, account)
        sync = f"-c synchronous_standby_names='{STANDBY_NAME}'" if mode == "sync" else ""
        pair._start(pair.primary_data, pair.primary_socket, sync)
        code, out = _run(
            [str(bindir / "pg_basebackup"), "-D", str(pair.standby_data), "-R",
             "-X", "stream", "-c", "fast", "-h", str(pair.primary_socket), "-p", str(_PORT),
             "-U", SUPERUSER, "--no-sync"],
            account, root,
        )  # fmt: skip
        if code != 0:
            raise DatabaseUnavailableError(f"pg_basebackup failed ({code}): {out[-1500:]}")
        if lag_ms > 0:
            from benchmarks.delay_proxy import start_proxy

            pair._proxy = start_proxy(
                unix=str(pair.primary_socket / f".s.PGSQL.{_PORT}"), rtt_ms=lag_ms
            )
            upstream = f"host=127.0.0.1 port={pair._proxy.port}"
        else:
            upstream = f"host={pair.primary_socket} port={_PORT}"
        # After -R's own primary_conninfo: the later setting wins.
        with (pair.standby_data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"\nprimary_conninfo = '{upstream} user={SUPERUSER} "
                f"application_name={STANDBY_NAME}'\n"
            )
        _chown_tree(pair.standby_data, account)
        pair._start(pair.standby_data, pair.standby_socket)
        _wait_streaming(pair)
        return pair
    except BaseException:
        pair.stop()
        raise


def _wait_streaming(pair: ReplicaPair, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    want = "sync" if pair.mode == "sync" else "async"
    with psycopg.connect(pair.node_dsn("primary", "postgres"), autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
            if row is not None and row[0] == "streaming" and row[1] == want:
                return
            if time.monotonic() > deadline:
                raise DatabaseUnavailableError(
                    f"the standby is not streaming ({want}) after {timeout} s: {row}\n"
                    f"{_tail(pair.standby_data / 'server.log')}"
                )
            time.sleep(0.05)


def is_in_recovery(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])


__all__ = ["STANDBY_NAME", "Mode", "ReplicaPair", "multi_host_dsn", "start_replica_pair"]
