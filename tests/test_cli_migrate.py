"""`langgraph-deterministic migrate` and `status`, in-process through `cli.main([...])`:
dry run, phases, progress, exit codes (0 ok, 1 failed, 2 usage or connection)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic._db.migrate import VERSION_TABLE, discover, label
from langgraph_deterministic.cli import main

ALL = [label(m) for m in discover()]


@pytest.fixture
def fresh(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_cli")
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def _tables(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def test_dry_run_prints_the_sql_and_changes_nothing(
    fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--dsn", fresh, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "CREATE TABLE IF NOT EXISTS checkpoints (" in out
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_run_id_idx" in out
    assert "CREATE OR REPLACE FUNCTION lgd_guard_put(" in out
    for name in ALL:
        assert f"-- {name} [" in out
    assert f"-- {len(ALL)} migration(s) would be applied" in out
    assert _tables(fresh) == []


def test_dry_run_on_the_peers_database_says_what_it_skips(
    fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(fresh, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
    before = _tables(fresh)
    assert main(["migrate", "--dsn", fresh, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "skipped (index checkpoints_thread_id_idx exists)" in out
    assert _tables(fresh) == before


def test_phases_progress_and_status(fresh: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--dsn", fresh]) == 0
    out = capsys.readouterr().out
    assert out.count("pending ") == len(ALL) and f"{len(ALL)} pending" in out

    assert main(["migrate", "--dsn", fresh, "--phase", "pre"]) == 0
    out = capsys.readouterr().out
    pre = [label(m) for m in discover() if m.phase == "pre"]
    for name in pre:
        assert f"{name}: " in out  # one progress line per step, with its time
    assert " s: CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_run_id_idx" in out
    assert f"applied {len(pre)} migration(s) in " in out

    assert main(["migrate", "--dsn", fresh, "--phase", "post"]) == 0
    assert main(["migrate", "--dsn", fresh]) == 0
    assert capsys.readouterr().out.strip().endswith("up to date")

    assert main(["status", "--dsn", fresh]) == 0
    out = capsys.readouterr().out
    assert out.count("applied ") == len(ALL) and out.strip().endswith("up to date")


def test_dsn_from_the_environment(
    fresh: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh)
    assert main(["migrate"]) == 0
    assert "applied" in capsys.readouterr().out


def test_exit_code_2_on_usage_and_connection_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["migrate"]) == 2
    assert "migrate needs a database. Fix: pass --dsn" in capsys.readouterr().err
    assert main(["migrate", "--phase", "sideways", "--dsn", "x"]) == 2
    assert main([]) == 2
    assert main(["status", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to Postgres at" in err and "(from --dsn)" in err
    assert main(["migrate", "--dsn", "not a dsn ==="]) == 2


def test_exit_code_1_when_a_lock_cannot_be_had(
    fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(fresh, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
    # An open snapshot: the concurrent index build of 0003 cannot finish behind it.
    reader = psycopg.connect(fresh)
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT count(*) FROM checkpoints").fetchall()
    try:
        code = main(["migrate", "--dsn", fresh, "--lock-timeout", "0.1", "--lock-retries", "1"])
        assert code == 1
        err = capsys.readouterr().err
        assert "0003_pre_run_id_index could not get the lock" in err
        assert "Traceback" not in err
    finally:
        reader.close()
    assert main(["migrate", "--dsn", fresh]) == 0
    with psycopg.connect(fresh) as conn:
        count = conn.execute(f"SELECT count(*) FROM {VERSION_TABLE}").fetchone()
    assert count == (len(ALL),)


def test_python_dash_m_runs_the_command() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "langgraph_deterministic", "--help"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert "migrate" in out.stdout and "audit" in out.stdout
