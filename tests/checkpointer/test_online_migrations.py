"""Migrations beside live workers: no lock on the peer's tables when nothing needs
changing, writers never stalled behind a migration waiting for its lock, and a failed,
cancelled or killed migration releases its advisory lock so that re-running completes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver, MigrationLockTimeoutError
from langgraph_deterministic._db.migrate import ADVISORY_LOCK_KEY, discover, label

ALL = [label(m) for m in discover()]


@pytest.fixture
def peer_db(pg_server_dsn: str) -> Iterator[str]:
    """A database PostgresSaver set up (its migration v9), none of ours yet."""
    dsn = create_database(pg_server_dsn, prefix="lgd_online")
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def _advisory_holders(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (ADVISORY_LOCK_KEY,),
        ).fetchall()
    return [r[0] for r in rows]


def _wait_for(predicate: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _open_reader(dsn: str, table: str) -> psycopg.Connection[Any]:
    """A session left idle in a REPEATABLE READ transaction that read ``table`` (what a
    pg_dump or a long report looks like): it holds ACCESS SHARE and an old snapshot."""
    conn = psycopg.connect(dsn)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(f"SELECT count(*) FROM {table}").fetchall()
    return conn


class _Writers:
    """Threads writing checkpoints and pending writes as workers do, one row per
    autocommit statement, recording every statement's latency."""

    def __init__(self, dsn: str, n: int = 4) -> None:
        self._stop = threading.Event()
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(dsn, i)) for i in range(n)]

    def _run(self, dsn: str, worker: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                i = 0
                while not self._stop.is_set():
                    i += 1
                    t0 = time.perf_counter()
                    conn.execute(
                        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                        "checkpoint, metadata) VALUES (%s, '', %s, '{}', '{}')",
                        (f"w{worker}", f"{i:08d}"),
                    )
                    conn.execute(
                        "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, "
                        "checkpoint_id, task_id, idx, channel, blob) "
                        "VALUES (%s, '', %s, 't', 0, 'c', '')",
                        (f"w{worker}", f"{i:08d}"),
                    )
                    self.latencies.append(time.perf_counter() - t0)
                    time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def __enter__(self) -> _Writers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def test_setup_on_the_peers_database_locks_none_of_their_tables(peer_db: str) -> None:
    # EXCLUSIVE blocks every write and every DDL on these tables (reads still pass).
    # With no retries, any statement of ours that wanted a lock on them would fail.
    blocker = psycopg.connect(peer_db)
    blocker.execute("LOCK TABLE checkpoint_writes, checkpoint_blobs IN EXCLUSIVE MODE")
    try:
        with DeterministicSaver(peer_db) as saver:
            assert saver.setup(lock_retries=0) == ALL
    finally:
        blocker.close()


def test_dry_run_reads_the_catalog_and_changes_nothing(peer_db: str) -> None:
    steps: list[Any] = []
    with DeterministicSaver(peer_db) as saver:
        assert saver.setup(dry_run=True, progress=steps.append) == ALL
        assert saver.applied_migrations() == set()
    skipped = {s.sql.split()[6] for s in steps if s.action == "would skip"}
    assert skipped == {
        "checkpoints_thread_id_idx",
        "checkpoint_blobs_thread_id_idx",
        "checkpoint_writes_thread_id_idx",
    }
    assert {s.action for s in steps} == {"would run", "would skip"}
    with psycopg.connect(peer_db) as conn:
        assert conn.execute("SELECT to_regclass('lgd_runs')").fetchone() == (None,)


@pytest.mark.parametrize(
    "needs", ["alter", "index"], ids=["old-peer-schema-needs-ALTER", "needs-concurrent-index"]
)
def test_open_transactions_never_stall_writers_and_rerun_completes(
    peer_db: str, needs: str
) -> None:
    if needs == "alter":
        # A database of PostgresSaver before its v9: task_path is missing, so 0001 must
        # ALTER checkpoint_writes (ACCESS EXCLUSIVE) behind the open transactions.
        with psycopg.connect(peer_db, autocommit=True) as conn:
            conn.execute("ALTER TABLE checkpoint_writes DROP COLUMN task_path")
            conn.execute("DELETE FROM checkpoint_migrations WHERE v = 9")
    readers = [_open_reader(peer_db, "checkpoint_writes"), _open_reader(peer_db, "checkpoints")]
    try:
        with _Writers(peer_db) as writers, DeterministicSaver(peer_db) as saver:
            time.sleep(0.3)
            with pytest.raises(MigrationLockTimeoutError) as failed:
                saver.setup(lock_timeout=0.2, lock_retries=3)
            time.sleep(0.3)
        assert not writers.errors, writers.errors
        assert len(writers.latencies) > 20
        assert max(writers.latencies) < 1.0, sorted(writers.latencies)[-5:]
        message = str(failed.value)
        assert "lock_timeout 200ms, 4 times" in message
        assert "idle in transaction" in message and "migrate" in message
        assert _advisory_holders(peer_db) == []
    finally:
        for r in readers:
            r.close()
    with DeterministicSaver(peer_db) as saver:
        assert saver.setup() != []
        assert saver.applied_migrations() == {m.version for m in discover()}
    with psycopg.connect(peer_db) as conn:
        invalid = conn.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid").fetchone()
        assert invalid == (0,)
        column = conn.execute(
            "SELECT 1 FROM information_schema.columns "
            "WHERE table_name = 'checkpoint_writes' AND column_name = 'task_path'"
        ).fetchone()
        assert column == (1,)


def _start_cli_migration(dsn: str) -> subprocess.Popen[str]:
    """`langgraph-deterministic migrate` that will be retrying 0003 (its concurrent index
    waits for the open snapshot) when the caller acts."""
    cli = [sys.executable, "-m", "langgraph_deterministic.cli"]
    proc = subprocess.Popen(
        [*cli, "migrate", "--dsn", dsn, "--lock-retries", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert _wait_for(lambda: _advisory_holders(dsn)), "the migration never took its lock"
    with psycopg.connect(dsn, autocommit=True) as conn:

        def applied_0002() -> bool:
            try:
                row = conn.execute(
                    "SELECT count(*) FROM langgraph_deterministic_migrations WHERE version = 2"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                return False
            return row == (1,)

        assert _wait_for(applied_0002)
    time.sleep(0.5)  # now inside 0003's retries
    return proc


@pytest.mark.parametrize("how", ["pg_terminate_backend", "SIGKILL"])
def test_a_killed_migration_releases_its_lock_and_rerun_completes(peer_db: str, how: str) -> None:
    reader = _open_reader(peer_db, "checkpoints")
    try:
        proc = _start_cli_migration(peer_db)
        (holder,) = _advisory_holders(peer_db)
        if how == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            with psycopg.connect(peer_db, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (holder,))
        out, err = proc.communicate(timeout=60)
        if how == "SIGKILL":
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode in (1, 2), (out, err)
            assert "Traceback" not in err, err
        # The server ends the dead session (at its next lock wait or sleep, both short).
        assert _wait_for(lambda: not _advisory_holders(peer_db)), "advisory lock still held"
    finally:
        reader.close()
    with DeterministicSaver(peer_db) as saver:
        assert saver.setup() == ALL[2:]  # 0001 and 0002 were committed before the kill
    with psycopg.connect(peer_db) as conn:
        assert conn.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid").fetchone() == (0,)


def test_a_cancelled_asetup_gives_the_pooled_connection_back_clean(peer_db: str) -> None:
    async def scenario() -> None:
        async with AsyncConnectionPool(
            peer_db, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        ) as pool:
            saver = DeterministicSaver(pool)
            reader = _open_reader(peer_db, "checkpoints")
            try:
                task = asyncio.create_task(saver.asetup(lock_retries=1000))
                await asyncio.sleep(1.5)
                assert len(_advisory_holders(peer_db)) == 1
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert _advisory_holders(peer_db) == []
                async with pool.connection() as conn:  # the same, only connection
                    cur = await conn.execute("SELECT current_setting('lock_timeout')")
                    assert await cur.fetchone() == ("0",)
            finally:
                reader.close()
            assert await saver.asetup() == ALL[2:]

    asyncio.run(scenario())
