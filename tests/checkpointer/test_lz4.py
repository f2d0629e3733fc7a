"""Migrations 0018 and 0022: checkpoint_blobs.blob, then checkpoints.checkpoint and
checkpoint_writes.blob compressed with lz4 where the server has it, each set only if its
table's lock is free within lock_timeout (skipped, never queued, when busy), and nothing
at all on a server without lz4."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from devtools.postgres import create_database, database_name, drop_database, start_postgres
from langgraph_deterministic import DeterministicSaver

_HAS_LZ4 = (
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)
_COMPRESSION = (
    "SELECT attcompression::text FROM pg_attribute "
    "WHERE attrelid = %s::regclass AND attname = %s"
)
#: the columns 0018 and 0022 set
COLUMNS = [("checkpoint_blobs", "blob"), ("checkpoints", "checkpoint"), ("checkpoint_writes", "blob")]


def _has_lz4(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_HAS_LZ4).fetchone()
    return bool(row and row[0])


def _compression(dsn: str, table: str = "checkpoint_blobs", column: str = "blob") -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_COMPRESSION, (table, column)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture(scope="module")
def lz4_server(pg_server_dsn: str) -> Iterator[str]:
    """The session's server if it has lz4, else one from the machine's PostgreSQL binaries
    (Debian's and most distributions' builds have lz4; pgserver's has not)."""
    if _has_lz4(pg_server_dsn):
        yield pg_server_dsn
        return
    try:
        server = start_postgres(backend="system")
    except Exception as exc:  # no system binaries here
        pytest.skip(f"no Postgres with lz4 on this machine: {exc}")
    try:
        if not _has_lz4(server.dsn):
            pytest.skip("the machine's PostgreSQL is built without lz4")
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def lz4_db(lz4_server: str) -> Iterator[str]:
    dsn = create_database(lz4_server, prefix="lgd_lz4")
    try:
        yield dsn
    finally:
        drop_database(lz4_server, database_name(dsn))


def test_setup_compresses_new_blobs_with_lz4(lz4_db: str) -> None:
    with DeterministicSaver(lz4_db, run_id_policy="off") as saver:
        saver.setup()
        assert _compression(lz4_db) == "l"
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"big": ["x" * 20_000]}
        checkpoint["channel_versions"] = {"big": "1"}
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {"big": "1"})  # type: ignore[arg-type]
    with psycopg.connect(lz4_db, autocommit=True) as conn:
        row = conn.execute("SELECT pg_column_compression(blob) FROM checkpoint_blobs").fetchone()
    assert row == ("lz4",)


def test_a_busy_table_is_skipped_not_waited_for(lz4_db: str) -> None:
    with DeterministicSaver(lz4_db) as saver:
        saver.setup()
    with psycopg.connect(lz4_db, autocommit=True) as conn:
        # as before 0018 ran: the column at the server's default, 0018 not recorded
        conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION default")
        conn.execute("DELETE FROM langgraph_deterministic_migrations WHERE version = 18")
    blocker = psycopg.connect(lz4_db)
    blocker.execute("LOCK TABLE checkpoint_blobs IN EXCLUSIVE MODE")
    try:
        with DeterministicSaver(lz4_db) as saver:
            applied = saver.setup(lock_retries=0)  # would raise if the ALTER waited
        assert applied == ["0018_pre_blob_lz4"]
        assert _compression(lz4_db) == ""
    finally:
        blocker.close()


def test_setup_compresses_new_checkpoints_and_writes_with_lz4(lz4_db: str) -> None:
    with DeterministicSaver(lz4_db, run_id_policy="off") as saver:
        saver.setup()
        assert [_compression(lz4_db, t, c) for t, c in COLUMNS] == ["l", "l", "l"]
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        # a checkpoint past the TOAST threshold (many channels), and a big pending write
        checkpoint["channel_versions"] = {f"channel_{i:03}": f"{i:032}.0" for i in range(80)}
        stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {})  # type: ignore[arg-type]
        saver.put_writes(stored, [("messages", "x" * 20_000)], "task-1")
    with psycopg.connect(lz4_db, autocommit=True) as conn:
        checkpoints = conn.execute(
            "SELECT pg_column_compression(checkpoint) FROM checkpoints"
        ).fetchall()
        writes = conn.execute("SELECT pg_column_compression(blob) FROM checkpoint_writes").fetchall()
    assert checkpoints == [("lz4",)] and writes == [("lz4",)]


def test_0022_skips_a_busy_table_and_sets_the_other(lz4_db: str) -> None:
    with DeterministicSaver(lz4_db) as saver:
        saver.setup()
    with psycopg.connect(lz4_db, autocommit=True) as conn:
        for table, column in COLUMNS[1:]:  # as before 0022 ran
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION default")
        conn.execute("DELETE FROM langgraph_deterministic_migrations WHERE version = 22")
    blocker = psycopg.connect(lz4_db)
    blocker.execute("LOCK TABLE checkpoint_writes IN EXCLUSIVE MODE")
    try:
        with DeterministicSaver(lz4_db) as saver:
            applied = saver.setup(lock_retries=0)  # would raise if the ALTER waited
        assert applied == ["0022_pre_lz4_checkpoints_writes"]
        assert _compression(lz4_db, "checkpoints", "checkpoint") == "l"
        assert _compression(lz4_db, "checkpoint_writes", "blob") == ""
    finally:
        blocker.close()


def test_the_session_server_gets_lz4_exactly_when_it_has_it(dsn: str) -> None:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    expected = "l" if _has_lz4(dsn) else ""
    assert [_compression(dsn, t, c) for t, c in COLUMNS] == [expected] * 3
