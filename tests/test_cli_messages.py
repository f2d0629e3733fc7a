"""Every CLI message says what happened to what the user did, through ``cli.main([...])``:
a refused login names the failed authentication and where the DSN came from, every option
has help text, and audit does not call a thread both skipped and damaged."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.ops import _plant

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main

ROLE = "lgd_pw_user"


def _parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser main() builds (caught at parse_args)."""
    seen: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    main([])
    return seen[0]


def test_every_subcommand_and_option_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = _parser(monkeypatch)
    missing = []
    seen_commands = set()

    def walk(p: argparse.ArgumentParser, where: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    seen_commands.add(name)
                    if not helps.get(name):
                        missing.append(f"{name} (the subcommand)")
                    walk(sub, f"{where} {name}")
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")

    walk(parser, "langgraph-deterministic")
    assert {"migrate", "status", "demo", "audit", "repair", "uninstall"} <= seen_commands
    assert not missing, f"options without help text: {missing}"


# --- a role that logs in with a password -------------------------------------------


@pytest.fixture(scope="module")
def password_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A DSN of a role the server checks by password (scram), on a scratch database.

    The server's pg_hba.conf gets two lines for that role only, written through the
    server (pg_read_file / COPY TO, as superuser) and put back afterwards."""
    dsn = create_database(pg_server_dsn, prefix="lgd_pw")
    admin = psycopg.connect(pg_server_dsn, autocommit=True)
    try:
        try:
            (path,) = admin.execute("SHOW hba_file").fetchone()  # type: ignore[misc]
            (before,) = admin.execute("SELECT pg_read_file(%s)", (path,)).fetchone()  # type: ignore[misc]
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test server's role cannot read pg_hba.conf (not a superuser)")
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD 'right-password'").format(
                sql.Identifier(ROLE)
            )
        )
        def write(text: str) -> None:
            lines = [ln.replace("\t", " ") for ln in text.splitlines()]
            admin.execute(
                sql.SQL("COPY (SELECT unnest({}::text[])) TO {}").format(
                    sql.Literal(lines), sql.Literal(path)
                )
            )
            admin.execute("SELECT pg_reload_conf()")
            time.sleep(0.3)  # the postmaster rereads it asynchronously

        ours = f"local all {ROLE} scram-sha-256\nhost all {ROLE} all scram-sha-256\n"
        write(ours + before)
        params = conninfo_to_dict(dsn)
        params.update(user=ROLE, password="wrong-password")
        yield make_conninfo("", **params)
    finally:
        try:
            if "before" in locals():
                write(before)
        finally:
            drop_database(pg_server_dsn, database_name(dsn))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
            admin.close()


def _with_password(dsn: str, password: str) -> str:
    return make_conninfo(dsn, password=password)


@pytest.mark.parametrize(
    "argv",
    [["audit"], ["repair"], ["repair", "--apply"], ["uninstall", "--dry-run"], ["status"],
     ["migrate"], ["demo"]],
    ids=lambda a: " ".join(a),
)  # fmt: skip
def test_a_wrong_password_says_authentication_failed_for_that_dsn(
    password_dsn: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main([*argv, "--dsn", password_dsn]) == 2
    err = capsys.readouterr().err
    assert "authentication failed for" in err and "(from --dsn)" in err, err
    assert f"user={ROLE}" in err and "wrong-password" not in err  # named, not leaked
    assert "Fix: correct the user name or password in --dsn" in err
    assert "docker" not in err and "pass --dsn" not in err


def test_the_same_from_database_url_names_database_url(
    password_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", password_dsn)
    assert main(["audit"]) == 2
    err = capsys.readouterr().err
    assert "authentication failed for" in err and "(from $DATABASE_URL)" in err
    assert "in $DATABASE_URL" in err
    # and with the right password the login works: the role is real
    monkeypatch.setenv("DATABASE_URL", _with_password(password_dsn, "right-password"))
    assert main(["audit"]) == 2
    assert "no checkpoint tables" in capsys.readouterr().err


def test_other_connection_failures_say_what_failed(
    pg_server_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["audit"]) == 2
    assert "audit needs a database. Fix: pass --dsn" in capsys.readouterr().err
    missing = make_conninfo(pg_server_dsn, dbname="lgd_no_such_database")
    assert main(["audit", "--dsn", missing]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "name an existing one in --dsn" in err
    assert main(["demo", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to Postgres at" in err and "host and port" in err
    assert main(["uninstall", "--dsn", "not a dsn ==="]) == 2
    assert "not a valid libpq connection string" in capsys.readouterr().err


# --- audit on a thread whose run may still be going ----------------------------------


@pytest.fixture(scope="module")
def busy_db(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_busy")
    try:
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            _plant.plant_with(saver, "tuple", ("reapplied", "done"))
        yield dsn
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def test_a_thread_with_a_run_in_progress_is_not_called_skipped_and_damaged(
    busy_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # written a moment ago: within --idle (10 minutes), so a run may be in progress
    capsys.readouterr()
    assert main(["audit", "--dsn", busy_db]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "skipped" not in out
    assert "1 with a run in progress" in out and "repair leaves them until they are idle" in out
    assert (
        "1 of these may have a run in progress (written within --idle): repair leaves "
        "them until they are idle (if their workers are dead, `repair --idle 0` repairs "
        "them now): tuple-reapplied" in out
    )
    capsys.readouterr()
    assert main(["audit", "--dsn", busy_db, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(t["thread_id"], t["run_in_progress"]) for t in report["damaged_threads"]] == [
        ("tuple-reapplied", True)
    ]
    assert main(["repair", "--dsn", busy_db, "--json"]) == 1
    (plan,) = json.loads(capsys.readouterr().out)["threads"]
    assert plan["refused"].startswith("a run may be in progress")
    # the way out for a dead worker is named, and it works as said
    assert "if the worker is dead (crashed, killed), repair it now with `--idle 0`" in (
        plan["refused"]
    )
    assert main(["repair", "--dsn", busy_db, "--idle", "0", "--json"]) == 1  # a plan
    (plan,) = json.loads(capsys.readouterr().out)["threads"]
    assert plan["refused"] is None, plan
