"""Migrations: ordered, idempotent, safe to run from many processes at once, online-safe,
and polite to a database langgraph-checkpoint-postgres already set up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import ConfigurationError, DeterministicSaver
from langgraph_deterministic._db.migrate import VERSION_TABLE, discover


@pytest.fixture
def fresh(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_mig")
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def _schema(dsn: str) -> dict[str, Any]:
    """Everything of the peer's that our setup must not change."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_name LIKE 'checkpoint%' "
            "ORDER BY 1, 2"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'checkpoint%' "
            "ORDER BY 1"
        ).fetchall()
        versions = conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v").fetchall()
    return {"columns": columns, "indexes": indexes, "versions": versions}


def test_setup_is_idempotent_and_records_every_version(fresh: str) -> None:
    with DeterministicSaver(fresh) as saver:
        first = saver.setup()
        assert first == [f"{m.version:04d}_{m.phase}_{m.name}" for m in discover()]
        assert saver.setup() == []
        assert saver.applied_migrations() == {m.version for m in discover()}


def test_setup_over_the_peers_schema_adds_only_ours(fresh: str) -> None:
    with psycopg.connect(fresh, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    before = _schema(fresh)
    with DeterministicSaver(fresh) as saver:
        saver.setup()
    after = _schema(fresh)
    assert after["columns"] == before["columns"]
    assert after["versions"] == before["versions"]
    added = set(after["indexes"]) - set(before["indexes"])
    assert set(before["indexes"]) <= set(after["indexes"])
    assert {name for name, _ in added} == {"checkpoints_run_id_idx"}


def test_peer_setup_after_ours_finds_nothing_to_do(fresh: str) -> None:
    with DeterministicSaver(fresh) as saver:
        saver.setup()
    before = _schema(fresh)
    with psycopg.connect(fresh, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    assert _schema(fresh) == before


def test_concurrent_setup_from_many_processes(fresh: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "langgraph_deterministic.cli", "migrate", "--dsn", fresh],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    # Exactly one process applied the migrations; the others found them done.
    appliers = [out for out, _ in outputs if "applied" in out]
    assert len(appliers) == 1, outputs
    with psycopg.connect(fresh) as conn:
        rows = conn.execute(f"SELECT version FROM {VERSION_TABLE} ORDER BY 1").fetchall()
        assert [r[0] for r in rows] == [m.version for m in discover()]
        # The advisory lock is released: nobody holds it any more.
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchone()
        assert held == (0,)


def test_an_interrupted_concurrent_index_build_is_redone(fresh: str) -> None:
    with DeterministicSaver(fresh) as saver:
        saver.setup(phase="pre")
    with psycopg.connect(fresh, autocommit=True) as conn:
        # Reproduce what a killed CREATE INDEX CONCURRENTLY leaves: an INVALID index of
        # that name. A unique build over duplicates fails in exactly that state.
        conn.execute("DROP INDEX checkpoints_run_id_idx")
        conn.execute(f"DELETE FROM {VERSION_TABLE} WHERE version = 3")
        for i in range(2):
            conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)"
                " VALUES ('t', '', %s, '{}', '{\"run_id\": \"dup\"}')",
                (f"c{i}",),
            )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY checkpoints_run_id_idx "
                "ON checkpoints ((metadata ->> 'run_id'))"
            )
        valid = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'checkpoints_run_id_idx'::regclass"
        ).fetchone()
        assert valid == (False,)
    with DeterministicSaver(fresh) as saver:
        assert saver.setup() == ["0003_pre_run_id_index"]
    with psycopg.connect(fresh) as conn:
        row = conn.execute(
            "SELECT i.indisvalid, i.indisunique FROM pg_index i "
            "WHERE indexrelid = 'checkpoints_run_id_idx'::regclass"
        ).fetchone()
        assert row == (True, False)


def test_post_phase_needs_the_pre_phase_first(fresh: str) -> None:
    with DeterministicSaver(fresh) as saver, pytest.raises(ConfigurationError, match="--phase pre"):
        saver.setup(phase="post")


def test_a_role_that_does_not_own_the_peers_tables_gets_a_migration_error(
    fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Adopting with the application's role: it may use the peer's tables, but altering or
    indexing them takes their owner. The failed step names that, as a MigrationError (the
    CLI prints one line, no traceback), and the steps before it stay applied."""
    import uuid

    from langgraph_deterministic import MigrationError, run_config
    from langgraph_deterministic.cli import main

    with PostgresSaver.from_conn_string(fresh) as peer:
        peer.setup()
    role = f"lgd_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
    as_app = psycopg.conninfo.make_conninfo(fresh, user=role)
    try:
        with DeterministicSaver(as_app) as saver, pytest.raises(MigrationError) as err:
            saver.setup()
        assert "owns the tables" in str(err.value) and "must be owner" in str(err.value)
        capsys.readouterr()
        assert main(["migrate", "--dsn", as_app]) != 0
        out = capsys.readouterr().err
        assert out.startswith("error: Migration ") and "Traceback" not in out
        # As the owner, the same migration completes from where it stopped.
        with DeterministicSaver(fresh) as saver:
            saver.setup()
            assert saver.applied_migrations() == {m.version for m in discover()}
        # Without grants on our tables, a worker's call names the grants it needs.
        with DeterministicSaver(as_app) as saver, pytest.raises(
            ConfigurationError, match="GRANT USAGE, SELECT ON ALL SEQUENCES"
        ):
            _one_node().compile(checkpointer=saver).invoke({"messages": []}, run_config("g0", "r"))
        # docs/how-to/adopting.md's grants: then workers run as the application's role, the
        # multitask queue (a sequence) included.
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
            conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}")
        _graph_calls_as(as_app)
    finally:
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _one_node(node: Any = lambda s: {"messages": [("ai", "ok")]}) -> Any:
    from langgraph.graph import START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    return builder


def _graph_calls_as(dsn: str) -> None:
    """Two turns of a graph on one thread, the second enqueued behind a held lease."""
    import threading

    from langgraph.graph import MessagesState

    from langgraph_deterministic import run_config

    entered, release = threading.Event(), threading.Event()

    def slow(state: MessagesState) -> dict[str, Any]:
        entered.set()
        release.wait(10)
        return {"messages": [("ai", "ok")]}

    with DeterministicSaver(dsn) as saver:
        graph = _one_node(slow).compile(checkpointer=saver)
        first = threading.Thread(
            target=graph.invoke, args=({"messages": [("user", "1")]}, run_config("g", "r1"))
        )
        first.start()
        assert entered.wait(10)  # r1 holds the thread's lease: r2 queues behind it
        threading.Timer(0.5, release.set).start()
        out = graph.invoke({"messages": [("user", "2")]},
                           run_config("g", "r2", multitask_strategy="enqueue"))  # fmt: skip
        first.join()
    assert [m.content for m in out["messages"]] == ["1", "ok", "2", "ok"]


@pytest.mark.parametrize("when", ["waiting for its lock", "pausing between attempts"])
def test_a_cancelled_step_is_a_migration_error_and_the_next_run_completes(
    fresh: str, when: str
) -> None:
    """An operator cancels a migration stuck behind a long transaction (pg_cancel_backend):
    whether the step was waiting for its lock or pausing before its next attempt, setup()
    raises a MigrationError naming the step, and the next run completes it."""
    import threading
    import time

    from langgraph_deterministic import MigrationError

    with PostgresSaver.from_conn_string(fresh) as peer:
        peer.setup()
    app = "lgd-mig-cancel"
    migrating = psycopg.conninfo.make_conninfo(fresh, application_name=app)
    wait = ("wait_event_type = 'Lock'" if when == "waiting for its lock"
            else "wait_event = 'PgSleep'")  # fmt: skip
    with psycopg.connect(fresh) as blocker:
        blocker.execute("LOCK TABLE checkpoints IN ACCESS EXCLUSIVE MODE")  # stays open
        cancelled: list[int] = []

        def cancel() -> None:
            with psycopg.connect(fresh, autocommit=True) as conn:
                for _ in range(300):
                    rows = conn.execute(
                        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                        f"WHERE application_name = %s AND {wait}", (app,)
                    ).fetchall()
                    if rows:
                        cancelled.append(len(rows))
                        return
                    time.sleep(0.01)

        canceller = threading.Thread(target=cancel)
        canceller.start()
        with DeterministicSaver(migrating) as saver, pytest.raises(
            MigrationError, match="was cancelled during"
        ):
            saver.setup(lock_retries=50)
        canceller.join()
        assert cancelled
        blocker.rollback()
    with DeterministicSaver(fresh) as saver:
        saver.setup()
        assert saver.applied_migrations() == {m.version for m in discover()}
