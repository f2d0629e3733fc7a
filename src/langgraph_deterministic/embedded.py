"""A throw-away Postgres for tests, demos and laptops without one.

:meth:`EmbeddedPostgres.start` runs a private PostgreSQL server that listens only on a unix
socket in a fresh directory, and gives back a libpq DSN for it. Two backends:

``pgserver``
    The `pgserver <https://pypi.org/project/pgserver/>`_ wheel, which ships PostgreSQL 16
    binaries (``pip install 'langgraph-deterministic[embedded]'``).
``system``
    The machine's own PostgreSQL binaries (``initdb``, ``pg_ctl``, ``postgres`` on ``PATH``,
    in ``$LGD_PG_BIN``, or under ``/usr/lib/postgresql/*/bin``).

The default, ``auto``, tries ``pgserver`` and falls back to ``system``. Choose one with the
``backend`` argument or ``LGD_EMBEDDED_BACKEND=pgserver|system|auto``.

Postgres refuses to run as root. When this process is root, ``pgserver`` runs the server as
the OS user ``pgserver`` and the ``system`` backend as the OS user ``lgd_postgres``; each is
created with ``useradd`` the first time.

:func:`ensure_database_url` returns ``$DATABASE_URL`` when it is set (after checking that it
answers) and otherwise starts an embedded server. :func:`create_database` and
:func:`drop_database` make and remove scratch databases on any server.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
)

Backend = Literal["pgserver", "system"]

BACKEND_ENV: Final = "LGD_EMBEDDED_BACKEND"
"""Environment variable choosing the backend: ``pgserver``, ``system`` or ``auto``."""

PG_BIN_ENV: Final = "LGD_PG_BIN"
"""Environment variable naming a directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""

SYSTEM_BACKEND_USER: Final = "lgd_postgres"
"""OS user the ``system`` backend runs Postgres as when this process is root."""

_SUPERUSER: Final = "postgres"
_PORT: Final = 5432  # only names the socket file: the server listens on no TCP address
_TIMEOUT_S: Final = 60
_FIX: Final = (
    "set DATABASE_URL to a running Postgres (e.g. `docker compose up -d postgres` with this "
    "repository's docker-compose.yml), or pip install 'langgraph-deterministic[embedded]' "
    "for pgserver, or install the PostgreSQL server binaries (initdb, pg_ctl, postgres)"
)


class EmbeddedPostgres:
    """A private PostgreSQL server on a unix socket; stop it with :meth:`stop` or ``with``.

    Build it with :meth:`start`. :attr:`dsn` connects as the superuser ``postgres`` to the
    database ``postgres``, without a password.
    """

    dsn: str
    """libpq URI of the server, usable with ``psycopg.connect`` and ``psql``."""
    backend: Backend
    """Which backend runs the server."""
    data_dir: Path
    """The server's data directory (PGDATA)."""

    def __init__(
        self,
        *,
        dsn: str,
        backend: Backend,
        data_dir: Path,
        shutdown: Callable[[], None],
        scratch: Path | None,
    ) -> None:
        self.dsn = dsn
        self.backend = backend
        self.data_dir = data_dir
        self._shutdown: Callable[[], None] | None = shutdown
        self._scratch = scratch
        atexit.register(self.stop)

    @classmethod
    def start(cls, data_dir: Path | None = None, *, backend: str | None = None) -> EmbeddedPostgres:
        """Start a server and return once it accepts connections.

        ``data_dir=None`` puts the data in a new temporary directory that :meth:`stop`
        deletes. A given ``data_dir`` is kept: it is initialised on first use and reused
        (with its data) afterwards. ``backend`` is ``"pgserver"``, ``"system"`` or
        ``"auto"``; ``None`` reads ``$LGD_EMBEDDED_BACKEND`` (default ``auto``).
        """
        choice = (backend or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
        if choice not in ("auto", "pgserver", "system"):
            raise ConfigurationError(
                f"unknown embedded Postgres backend {choice!r} (from the backend argument or "
                f"${BACKEND_ENV}). Fix: use 'pgserver', 'system' or 'auto'."
            )
        if choice == "pgserver":
            return _start(_launch_pgserver, data_dir)
        if choice == "system":
            return _start(_launch_system, data_dir)
        try:
            return _start(_launch_pgserver, data_dir)
        except DeterministicError as pgserver_error:
            try:
                return _start(_launch_system, data_dir)
            except DeterministicError as system_error:
                raise DatabaseUnavailableError(
                    "could not start an embedded Postgres. "
                    f"pgserver: {pgserver_error} | system binaries: {system_error} | "
                    f"Fix: {_FIX}."
                ) from system_error

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
        return f"EmbeddedPostgres(backend={self.backend!r}, dsn={self.dsn!r}, {state})"


_Launched = tuple[str, Callable[[], None]]  # (dsn, shutdown)
_Launcher = Callable[[Path, Path, bool], _Launched]  # (data_dir, scratch, ephemeral)


def _start(launcher: _Launcher, data_dir: Path | None) -> EmbeddedPostgres:
    backend: Backend = "pgserver" if launcher is _launch_pgserver else "system"
    scratch = Path(tempfile.mkdtemp(prefix="lgd-pg-"))
    ephemeral = data_dir is None
    data = scratch / "data" if data_dir is None else data_dir.expanduser().resolve()
    try:
        dsn, shutdown = launcher(data, scratch, ephemeral)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return EmbeddedPostgres(
        dsn=dsn, backend=backend, data_dir=data, shutdown=shutdown, scratch=scratch
    )


def _socket_dsn(socket_dir: Path, port: int, dbname: str = "postgres") -> str:
    host = quote(str(socket_dir), safe="/")
    return f"postgresql://{_SUPERUSER}@/{dbname}?host={host}&port={port}"


# -- pgserver ------------------------------------------------------------------------


def _launch_pgserver(data: Path, scratch: Path, ephemeral: bool) -> _Launched:
    del scratch, ephemeral  # pgserver keeps its socket and log inside the data directory
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from pgserver.postgres_server import get_server
    except ImportError as exc:
        raise ConfigurationError(
            f"the pgserver package is not importable ({exc}). Fix: pip install "
            "'langgraph-deterministic[embedded]' (CPython 3.10-3.12 on x86_64 Linux, macOS "
            f"or Windows), or set {BACKEND_ENV}=system to use installed PostgreSQL binaries, "
            "or set DATABASE_URL to a running Postgres."
        ) from exc
    try:
        data.parent.mkdir(parents=True, exist_ok=True)
        server: Any = get_server(data, cleanup_mode="stop")
        info: Any = server.get_postmaster_info()
        socket_dir, port = info.socket_dir, info.port
    except Exception as exc:  # pgserver raises assorted error types
        raise DatabaseUnavailableError(
            f"pgserver could not start Postgres in {data}: {type(exc).__name__}: {exc} "
            f"(server log: {data / 'log'}). Fix: {_FIX}."
        ) from exc
    if port is None or (socket_dir is None and not info.hostname):
        server.cleanup()
        raise DatabaseUnavailableError(
            f"pgserver started Postgres in {data} but reported neither a unix socket nor a "
            f"TCP address (see {data / 'postmaster.pid'}). Fix: {_FIX}."
        )
    if socket_dir is not None:
        dsn = _socket_dsn(Path(socket_dir), int(port))
    else:  # Windows: pgserver listens on 127.0.0.1
        dsn = f"postgresql://{_SUPERUSER}@{info.hostname}:{int(port)}/postgres"

    def shutdown() -> None:
        server.cleanup()

    return dsn, shutdown


# -- system binaries -----------------------------------------------------------------


def _find_binaries() -> Path:
    candidates: list[Path] = []
    override = os.environ.get(PG_BIN_ENV)
    if override:
        candidates.append(Path(override))
    else:
        on_path = shutil.which("pg_ctl")
        if on_path:
            candidates.append(Path(on_path).resolve().parent)

        def version(path: Path) -> int:
            found = re.search(r"(\d+)", path.parent.name)
            return int(found.group(1)) if found else 0

        for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"):
            root, _, rest = pattern.partition("*")
            found = sorted(Path(root).glob("*" + rest), key=version, reverse=True)
            candidates.extend(found)
    for directory in candidates:
        if all((directory / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return directory
    where = f"${PG_BIN_ENV}={override}" if override else "PATH, /usr/lib/postgresql/*/bin"
    raise ConfigurationError(
        f"no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in {where}. "
        "Fix: install them (e.g. apt-get install postgresql), point "
        f"${PG_BIN_ENV} at their directory, pip install 'langgraph-deterministic[embedded]' "
        "for pgserver, or set DATABASE_URL to a running Postgres."
    )


def _service_account() -> tuple[int, int] | None:
    """(uid, gid) to run Postgres as, or None to run it as ourselves (we are not root)."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_BACKEND_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            raise ConfigurationError(
                "Postgres refuses to run as root and `useradd` is missing, so the OS user "
                f"{SYSTEM_BACKEND_USER!r} cannot be created. Fix: run as a non-root user, "
                f"or create the user {SYSTEM_BACKEND_USER!r} yourself."
            ) from None
        done = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SYSTEM_BACKEND_USER],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        try:
            entry = pwd.getpwnam(SYSTEM_BACKEND_USER)  # a concurrent process may have won
        except KeyError:
            raise ConfigurationError(
                f"could not create the OS user {SYSTEM_BACKEND_USER!r} to run Postgres as "
                f"(Postgres refuses root): {done.stderr.strip()}. Fix: run as a non-root "
                f"user, or create the user {SYSTEM_BACKEND_USER!r} yourself."
            ) from None
    return entry.pw_uid, entry.pw_gid


def _run(argv: Sequence[str], account: tuple[int, int] | None, cwd: Path) -> tuple[int, str]:
    """Run a PostgreSQL tool; returns (exit code, combined output).

    Output goes to a temporary file, not a pipe: ``pg_ctl start`` leaves a server behind
    that could otherwise hold the pipe open.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    with tempfile.TemporaryFile("w+") as out:
        if account is None:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, timeout=_TIMEOUT_S, check=False,
            )  # fmt: skip
        else:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, timeout=_TIMEOUT_S, check=False,
                user=account[0], group=account[1], extra_groups=[],
            )  # fmt: skip
        out.seek(0)
        return done.returncode, out.read()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _check_reachable(path: Path, account: tuple[int, int]) -> None:
    """Fail early, and clearly, if the service account cannot reach ``path``."""
    uid, gid = account
    for parent in reversed(path.parents):
        try:
            st = parent.stat()
        except FileNotFoundError:
            return  # we create the rest (mode 0755)
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise ConfigurationError(
                f"Postgres must run as the OS user {SYSTEM_BACKEND_USER!r} (it refuses root), "
                f"and that user cannot enter {parent} (mode {stat.filemode(st.st_mode)}), so it "
                f"cannot use the data directory {path}. Fix: choose a data_dir whose parent "
                f"directories others may enter (e.g. under /tmp or /var/lib), or `chmod o+x "
                f"{parent}`."
            )


def _launch_system(data: Path, scratch: Path, ephemeral: bool) -> _Launched:
    bindir = _find_binaries()
    account = _service_account()
    if account is not None:
        os.chown(scratch, *account)
        _check_reachable(data, account)
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    if account is not None:
        os.chown(data, *account)
    log = data / "lgd-postgres.log"

    if not (data / "PG_VERSION").exists():
        initdb = [
            str(bindir / "initdb"), "-D", str(data), "-U", _SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C",
        ]  # fmt: skip
        if ephemeral:
            initdb.append("--no-sync")
        code, output = _run(initdb, account, scratch)
        if code != 0:
            raise DatabaseUnavailableError(
                f"initdb ({bindir}) failed in {data} with exit code {code}: "
                f"{output.strip()[-1500:]}. Fix: make {data} an empty directory writable by "
                f"the user running Postgres, or {_FIX}."
            )

    server_options = f"-c listen_addresses='' -k {shlex.quote(str(scratch))} -p {_PORT}"
    pg_ctl = str(bindir / "pg_ctl")
    code, output = _run(
        [pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", str(_TIMEOUT_S),
         "-o", server_options, "start"],
        account, scratch,
    )  # fmt: skip
    if code != 0:
        raise DatabaseUnavailableError(
            f"pg_ctl ({bindir}) could not start Postgres in {data} (exit code {code}): "
            f"{output.strip()[-800:]}\nserver log ({log}):\n{_tail(log)}\n"
            f"Fix: stop any other server using {data}, or {_FIX}."
        )

    def shutdown() -> None:
        code, output = _run(
            [pg_ctl, "-D", str(data), "-m", "fast", "-w", "-t", str(_TIMEOUT_S), "stop"],
            account, scratch,
        )  # fmt: skip
        if code != 0 and (data / "postmaster.pid").exists():
            raise DatabaseUnavailableError(
                f"pg_ctl could not stop the Postgres in {data} (exit code {code}): "
                f"{output.strip()}. Fix: run `{pg_ctl} -D {data} stop -m immediate` "
                "as its owner."
            )

    return _socket_dsn(scratch, _PORT), shutdown


# -- DATABASE_URL and scratch databases ----------------------------------------------


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password masked, for messages; unparseable input is not echoed."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable connection string>"
    if "password" in params:
        params["password"] = "***"
    return make_conninfo("", **params)


def check_connection(
    dsn: str, *, source: str = "the connection string", timeout_s: int = 5
) -> None:
    """Connect once to ``dsn``; raise our errors naming ``source`` if that fails."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"{source} is not a valid libpq connection string ({exc}). Fix: use the form "
            "postgresql://user:password@host:5432/dbname."
        ) from None
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, timeout_s)) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot connect to Postgres at {redact_dsn(dsn)} (from {source}): "
            f"{str(exc).strip()}. Fix: start Postgres there (e.g. `docker compose up -d "
            f"postgres`) or correct {source}; or leave DATABASE_URL unset to use an "
            "embedded server (pip install 'langgraph-deterministic[embedded]')."
        ) from exc


def ensure_database_url(
    data_dir: Path | None = None, *, env_var: str = "DATABASE_URL"
) -> tuple[str, EmbeddedPostgres | None]:
    """Return ``($DATABASE_URL, None)`` if set and reachable, else start an embedded server.

    The caller owns the returned :class:`EmbeddedPostgres` (when not None) and stops it.
    """
    url = os.environ.get(env_var, "").strip()
    if url:
        check_connection(url, source=f"${env_var}")
        return url, None
    server = EmbeddedPostgres.start(data_dir)
    return server.dsn, server


def _connect_admin(admin_dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot connect to the admin database {redact_dsn(admin_dsn)}: "
            f"{str(exc).strip()}. Fix: {_FIX}."
        ) from exc


def create_database(admin_dsn: str, prefix: str = "lgd_test") -> str:
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
                f"the role in {redact_dsn(admin_dsn)} may not create databases ({exc}). "
                "Fix: ALTER ROLE ... CREATEDB, or use a superuser DSN for tests."
            ) from exc
        except psycopg.Error as exc:
            raise DatabaseUnavailableError(
                f"CREATE DATABASE {name} failed on {redact_dsn(admin_dsn)}: {exc}. "
                "Fix: check the server log and free disk space."
            ) from exc
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
                f"DROP DATABASE {dbname} failed on {redact_dsn(admin_dsn)}: {exc}. "
                "Fix: drop it by hand once nothing uses it."
            ) from exc


def database_name(dsn: str) -> str:
    """The ``dbname`` a conninfo or URI names (libpq defaults to the user name)."""
    params = conninfo_to_dict(dsn)
    # libpq's order: dbname, $PGDATABASE, then the user name (user, $PGUSER)
    name = (
        params.get("dbname")
        or os.environ.get("PGDATABASE")
        or params.get("user")
        or os.environ.get("PGUSER")
    )
    if not name:
        raise ConfigurationError(
            f"{redact_dsn(dsn)} names no database. Fix: add dbname=... (or /dbname to a URI)."
        )
    return str(name)


__all__ = [
    "BACKEND_ENV",
    "PG_BIN_ENV",
    "SYSTEM_BACKEND_USER",
    "EmbeddedPostgres",
    "check_connection",
    "create_database",
    "database_name",
    "drop_database",
    "ensure_database_url",
    "redact_dsn",
]
