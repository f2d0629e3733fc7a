"""A connection error says whether a retry can get past it, by cause: an unreachable,
restarting or read-only server, or a full pool, is retryable; a database that does not
exist, a failed login, a missing role or privilege is not (a retry loop would spin on a
configuration mistake forever). Real Postgres per cause, a constructed error per SQLSTATE,
and the errors page's table checked against both."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import psycopg.errors
import psycopg_pool
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import (
    DatabaseAccessError,
    DatabaseUnavailableError,
    DeterministicSaver,
    errors,
    is_retryable,
    run_config,
)
from langgraph_deterministic._db.translate import CONNECTION_SQLSTATES, translate_error
from langgraph_deterministic.retry import (
    EXIT_PERMANENT,
    EXIT_TRANSIENT,
    call_with_retries,
    exit_code,
)

ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "errors.md"
ROLE = "lgd_conn_err_role"


# --- one test per SQLSTATE -------------------------------------------------------------


@pytest.mark.parametrize("state", sorted(CONNECTION_SQLSTATES))
def test_each_sqlstate_is_classified(state: str) -> None:
    cls = psycopg.errors.lookup(state)
    original = cls(f"the server's message for {state}")
    assert original.sqlstate == state
    got = translate_error(original)
    retryable = CONNECTION_SQLSTATES[state][1]
    assert is_retryable(got) is retryable, (state, got)
    assert isinstance(got, DatabaseUnavailableError if retryable else DatabaseAccessError), got
    assert f"the server's message for {state}" in str(got) or state == "42501"
    assert "Fix:" in str(got) or "retry with the same run id" in str(got), str(got)


@pytest.mark.parametrize(
    ("message", "retryable"),
    [
        ('connection failed: FATAL:  database "nope" does not exist', False),
        ('connection failed: FATAL:  password authentication failed for user "u"', False),
        ('connection failed: FATAL:  role "nobody" does not exist', False),
        ('connection failed: FATAL:  role "r" is not permitted to log in', False),
        ('connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "u"', False),
        ('connection failed: FATAL:  permission denied for database "d"\nDETAIL:  User does '
         "not have CONNECT privilege.", False),
        ("connection failed: fe_sendauth: no password supplied", False),
        ("connection failed: ERROR:  no such database: app", False),  # PgBouncer
        ("connection failed: ERROR:  no such user: app", False),  # PgBouncer
        ("connection failed: Connection refused\n\tIs the server running on that host and "
         "accepting TCP/IP connections?", True),
        ("connection failed: FATAL:  the database system is starting up", True),
        ("connection failed: FATAL:  sorry, too many clients already", True),
        ("connection failed: timeout expired", True),
        ("connection failed: ERROR:  pgbouncer cannot connect to server", True),
        ("server closed the connection unexpectedly", True),
    ],
)  # fmt: skip
def test_a_connection_failure_without_sqlstate_is_classified_by_its_text(
    message: str, retryable: bool
) -> None:
    got = translate_error(psycopg.OperationalError(message))
    assert is_retryable(got) is retryable, (message, got)
    text = str(got)
    assert "\n" not in text and "?." not in text and " ." not in text, text


def test_a_full_pool_is_retryable_and_says_so() -> None:
    got = translate_error(psycopg_pool.PoolTimeout("couldn't get a connection after 1.00 sec"))
    assert isinstance(got, DatabaseUnavailableError) and is_retryable(got)
    assert "No pooled connection came free in time" in str(got)


def test_other_operational_errors_keep_their_type() -> None:
    for own in (psycopg.errors.DeadlockDetected("d"), psycopg.errors.QueryCanceled("c")):
        assert translate_error(own) is own


def test_the_retry_loop_and_exit_code_follow_the_classification() -> None:
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise translate_error(psycopg.errors.lookup("3D000")("database does not exist"))

    with pytest.raises(DatabaseAccessError):
        call_with_retries(refused, attempts=5, sleep=lambda s: None)
    assert len(calls) == 1  # not retried
    assert exit_code(DatabaseAccessError("x")) == EXIT_PERMANENT
    assert exit_code(DatabaseUnavailableError("x")) == EXIT_TRANSIENT


# --- the errors page's tables ------------------------------------------------------------


def _page_rows(heading: str) -> list[list[str]]:
    text = ERRORS_PAGE.read_text("utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
    cell = re.compile(r"^\[`(\w+)`\]\(#\w+\)$")  # a linked class name
    return [[cell.sub(r"\1", c.strip()).strip("`*") for c in r.strip("|").split("|")]
            for r in rows[1:]]  # fmt: skip


def test_the_errors_pages_sqlstate_table_matches_translate_error() -> None:
    rows = _page_rows("## Retryable by SQLSTATE")
    on_page = {r[0]: r for r in rows}
    assert set(on_page) == set(CONNECTION_SQLSTATES), "regenerate: python -m devtools.reference"
    for state, row in on_page.items():
        got = translate_error(psycopg.errors.lookup(state)("message"))
        assert row[2] == type(got).__name__, (state, row, got)
        assert row[3] == ("yes" if is_retryable(got) else "no"), (state, row)


def test_the_errors_pages_class_table_matches_is_retryable() -> None:
    rows = _page_rows("## Retryable by class")
    on_page = {r[0]: r[1] for r in rows}
    classes = [c for c in vars(errors).values() if isinstance(c, type)
               and issubclass(c, errors.DeterministicError)]  # fmt: skip
    assert set(on_page) == {c.__name__ for c in classes}, "regenerate: python -m devtools.reference"
    for cls in classes:
        assert on_page[cls.__name__] == ("yes" if is_retryable(cls("x")) else "no"), cls


# --- real Postgres, per cause ------------------------------------------------------------


@contextmanager
def _hba_first(admin: psycopg.Connection, lines: list[str]) -> Iterator[None]:
    """Put ``lines`` at the top of the server's pg_hba.conf (written through the server as
    superuser) for the block; the file is put back afterwards."""
    try:
        (path,) = admin.execute("SHOW hba_file").fetchone()  # type: ignore[misc]
        (before,) = admin.execute("SELECT pg_read_file(%s)", (path,)).fetchone()  # type: ignore[misc]
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test server's role cannot read pg_hba.conf (not a superuser)")

    def write(text_lines: list[str]) -> None:
        admin.execute(sql.SQL("COPY (SELECT unnest({}::text[])) TO {}").format(
            sql.Literal([ln.replace("\t", " ") for ln in text_lines]), sql.Literal(path)))  # fmt: skip
        admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)  # the postmaster rereads it asynchronously

    write(lines + before.splitlines())
    try:
        yield
    finally:
        write(before.splitlines())


@pytest.fixture(scope="module")
def scratch(pg_server_dsn: str) -> Iterator[tuple[str, psycopg.Connection]]:
    """A database with the checkpoint tables, a role with a password and no grants."""
    dsn = create_database(pg_server_dsn, prefix="lgd_conn_err")
    admin = psycopg.connect(pg_server_dsn, autocommit=True)
    role = sql.Identifier(ROLE)
    admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(role))
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'right-password'").format(role))
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    try:
        yield dsn, admin
    finally:
        drop_database(pg_server_dsn, database_name(dsn))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(role))
        admin.close()


def _as(dsn: str, **params: str) -> str:
    return make_conninfo("", **{**conninfo_to_dict(dsn), **params})


def _open(dsn: str, mode: str) -> BaseException:
    if mode == "sync":
        with pytest.raises(errors.DeterministicError) as caught:  # noqa: SIM117
            with DeterministicSaver(dsn) as saver:
                saver.get_tuple(run_config("t", "r"))
        return caught.value
    import asyncio

    async def go() -> None:
        async with DeterministicSaver(dsn) as saver:
            await saver.aget_tuple(run_config("t", "r"))

    with pytest.raises(errors.DeterministicError) as caught:
        asyncio.run(go())
    return caught.value


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_database_that_does_not_exist_is_not_retryable(
    scratch: tuple[str, psycopg.Connection], mode: str
) -> None:
    err = _open(_as(scratch[0], dbname="lgd_no_such_database"), mode)
    assert isinstance(err, DatabaseAccessError) and not is_retryable(err), err
    assert 'database "lgd_no_such_database" does not exist' in str(err)
    assert "createdb" in str(err) and "dbname" in str(err)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_role_that_does_not_exist_is_not_retryable(
    scratch: tuple[str, psycopg.Connection], mode: str
) -> None:
    err = _open(_as(scratch[0], user="lgd_no_such_role"), mode)
    assert isinstance(err, DatabaseAccessError) and not is_retryable(err), err
    assert "CREATE ROLE" in str(err)


def test_a_wrong_password_is_not_retryable_and_the_right_one_works(
    scratch: tuple[str, psycopg.Connection],
) -> None:
    dsn, admin = scratch
    with _hba_first(admin, [f"local all {ROLE} scram-sha-256",
                            f"host all {ROLE} all scram-sha-256"]):  # fmt: skip
        err = _open(_as(dsn, user=ROLE, password="wrong-password"), "sync")
        assert isinstance(err, DatabaseAccessError) and not is_retryable(err), err
        assert "password authentication failed" in str(err)
        assert "correct the user and password in the DSN" in str(err)
        assert "wrong-password" not in str(err)
        # the right password gets past the login (and on to the missing grants)
        err = _open(_as(dsn, user=ROLE, password="right-password"), "sync")
        assert "may not do this" in str(err), err


def test_a_role_without_connect_is_not_retryable_and_the_grant_named_fixes_it(
    scratch: tuple[str, psycopg.Connection],
) -> None:
    dsn, admin = scratch
    db = sql.Identifier(database_name(dsn))
    admin.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(db))
    try:
        err = _open(_as(dsn, user=ROLE), "sync")
        assert isinstance(err, DatabaseAccessError) and not is_retryable(err), err
        assert "permission denied for database" in str(err) and "GRANT CONNECT" in str(err)
        admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            db, sql.Identifier(ROLE)))  # fmt: skip
        err = _open(_as(dsn, user=ROLE), "sync")
        assert "permission denied for database" not in str(err), err
    finally:
        admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(db))
        admin.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
            db, sql.Identifier(ROLE)))  # fmt: skip


def test_a_table_without_grants_is_not_retryable_and_names_the_grant(
    scratch: tuple[str, psycopg.Connection],
) -> None:
    err = _open(_as(scratch[0], user=ROLE), "sync")
    assert isinstance(err, DatabaseAccessError) and not is_retryable(err), err
    assert "permission denied for table" in str(err)
    assert re.search(r"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES", str(err))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_unreachable_port_is_retryable_and_reads_as_one_sentence(mode: str) -> None:
    err = _open("postgresql://nobody@127.0.0.1:1/nothing", mode)
    assert isinstance(err, DatabaseUnavailableError) and is_retryable(err), err
    text = str(err)
    assert "Connection refused" in text and "?." not in text and "\n" not in text, text
    assert "connections? Check that the server is running" in text


def test_check_connection_and_the_cli_classify_the_same_way(
    scratch: tuple[str, psycopg.Connection], capsys: pytest.CaptureFixture[str]
) -> None:
    from langgraph_deterministic.cli import main
    from langgraph_deterministic.embedded import check_connection

    missing = _as(scratch[0], dbname="lgd_no_such_database")
    with pytest.raises(DatabaseAccessError, match="lgd_no_such_database"):
        check_connection(missing, source="$DATABASE_URL")
    with pytest.raises(DatabaseUnavailableError) as caught:
        check_connection("postgresql://nobody@127.0.0.1:1/nothing", source="$DATABASE_URL")
    assert "?." not in str(caught.value) and "connections? Fix:" in str(caught.value)
    capsys.readouterr()
    assert main(["audit", "--dsn", "postgresql://nobody@127.0.0.1:1/nothing"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "?." not in err and "connections? Fix: check that the server runs" in err, err
    assert main(["audit", "--dsn", _as(scratch[0], user=ROLE)]) == 2  # no grants yet
    err = " ".join(capsys.readouterr().err.split())
    assert "permission denied for table" in err and "GRANT SELECT, INSERT" in err, err
    db = sql.Identifier(database_name(scratch[0]))
    scratch[1].execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(db))
    try:
        assert main(["audit", "--dsn", _as(scratch[0], user=ROLE)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "may not connect to that database" in err and "GRANT CONNECT" in err, err
    finally:
        scratch[1].execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(db))


# --- a pool of the caller's: it reports only its timeout --------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pool_to_a_missing_database_says_so_and_is_not_retryable(
    scratch: tuple[str, psycopg.Connection], mode: str
) -> None:
    missing = _as(scratch[0], dbname="lgd_no_such_database")
    kwargs = {"autocommit": True, "prepare_threshold": 0}
    if mode == "sync":
        pool = psycopg_pool.ConnectionPool(missing, kwargs=kwargs, timeout=0.5, open=False)
        pool.open(wait=False)
        try:
            with pytest.raises(DatabaseAccessError, match="lgd_no_such_database") as caught:
                DeterministicSaver(pool).get_tuple(run_config("t", "r"))
        finally:
            pool.close()
    else:
        import asyncio

        async def go() -> BaseException:
            apool = psycopg_pool.AsyncConnectionPool(missing, kwargs=kwargs, timeout=0.5,
                                                     open=False)  # fmt: skip
            await apool.open(wait=False)
            try:
                with pytest.raises(DatabaseAccessError, match="lgd_no_such_database") as got:
                    await DeterministicSaver(apool).aget_tuple(run_config("t", "r"))
                return got.value
            finally:
                await apool.close()

        asyncio.run(go())
        return
    assert not is_retryable(caught.value)


def test_an_exhausted_pool_is_retryable(scratch: tuple[str, psycopg.Connection]) -> None:
    with psycopg_pool.ConnectionPool(scratch[0], kwargs={"autocommit": True}, min_size=1,
                                     max_size=1, timeout=0.5) as pool:  # fmt: skip
        saver = DeterministicSaver(pool)
        full = pytest.raises(DatabaseUnavailableError, match="No pooled connection")
        with pool.connection(), full as got:  # the only connection, held
            saver.get_tuple(run_config("t", "r"))
        assert is_retryable(got.value)
        assert saver.get_tuple(run_config("t", "r")) is None  # free again: it works
