"""PgBouncer in transaction pooling mode (what Supabase, Neon and RDS Proxy users run
behind): setup() refuses to migrate through it, at once and leaving nothing behind, and
works once the schema is migrated; prepare_threshold=None prepares nothing server-side;
the conformance suite and the retry contract pass through it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.types import Command
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from tests.conftest import make_database
from tests.pgbouncer import PgBouncer

from devtools.postgres import database_name, drop_database
from langgraph_deterministic import (
    ConfigurationError,
    DatabaseAccessError,
    DeterministicSaver,
    RunInputMismatchError,
    is_retryable,
    run_config,
)
from langgraph_deterministic._db.migrate import ADVISORY_LOCK_KEY, VERSION_TABLE

from .dropin import run_sync
from .graphs import build_graph, first_input

# psycopg's pool/connection settings for PgBouncer in transaction mode.
BOUNCER_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": None,
    "row_factory": dict_row,
}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


def _advisory_locks(dsn: str) -> int:
    with Connection.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND (classid::bigint << 32 | objid::bigint) = %s",
            (ADVISORY_LOCK_KEY,),
        ).fetchone()
        return int(row[0]) if row else -1


def test_setup_through_pgbouncer_refuses_to_migrate_and_leaves_nothing(
    pg_server_dsn: str, pgbouncer: PgBouncer
) -> None:
    fresh = make_database(pg_server_dsn, prefix="lgd_bouncer_setup")
    try:
        _setup_through_bouncer(fresh, pgbouncer.dsn_for(fresh))
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


def _setup_through_bouncer(fresh: str, via: str) -> None:
    def one_setup(_: int) -> BaseException | list[str]:
        try:
            with DeterministicSaver(via, prepare_threshold=None) as saver:
                return saver.setup()
        except Exception as exc:
            return exc

    # Six processes starting at once, as a deployment's workers do.
    with ThreadPoolExecutor(6) as ex:
        outcomes = list(ex.map(one_setup, range(6)))
    for outcome in outcomes:
        assert isinstance(outcome, ConfigurationError), outcome
        assert "direct connection" in str(outcome) and "Nothing was changed" in str(outcome)
    assert _advisory_locks(fresh) == 0
    with Connection.connect(fresh, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (VERSION_TABLE,)).fetchone() == (None,)
        assert conn.execute("SELECT to_regclass('checkpoints')").fetchone() == (None,)

    # Migrated once over a direct connection, setup() through the bouncer succeeds.
    with DeterministicSaver(fresh) as direct:
        assert direct.setup()
    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(one_setup, range(6))) == [[]] * 6
    assert _advisory_locks(fresh) == 0


async def test_asetup_through_pgbouncer_pool(db: str, pgbouncer: PgBouncer) -> None:
    async with AsyncConnectionPool(
        pgbouncer.dsn_for(db), min_size=1, max_size=2, kwargs=BOUNCER_KWARGS
    ) as pool:
        assert await DeterministicSaver(pool).asetup() == []


@pytest.mark.parametrize("threshold", [0, None])
def test_prepare_threshold_none_prepares_nothing(db: str, threshold: int | None) -> None:
    """Statement.prepare=True marks our hot statements, but a connection with
    prepare_threshold=None must prepare none of them (PgBouncer < 1.21 in transaction mode
    would send a later EXECUTE to a server session that never saw the PREPARE)."""
    kwargs = {**BOUNCER_KWARGS, "prepare_threshold": threshold}
    with Connection.connect(db, **kwargs) as conn:
        run_sync(DeterministicSaver(conn), f"prepared-{threshold}")
        (row,) = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchall()
    if threshold is None:
        assert row["n"] == 0
    else:
        assert row["n"] > 0  # the check can fail: with threshold 0 everything is prepared


async def test_prepare_threshold_none_prepares_nothing_async(db: str) -> None:
    async with await AsyncConnection.connect(db, **BOUNCER_KWARGS) as conn:
        saver = DeterministicSaver(conn)
        graph = build_graph().compile(checkpointer=saver)
        await graph.ainvoke(first_input(), run_config("aprepared", "aprepared:1"))
        await graph.ainvoke(Command(resume="ok"), run_config("aprepared", "aprepared:2"))
        cur = await conn.execute("SELECT count(*) AS n FROM pg_prepared_statements")
        assert (await cur.fetchone()) == {"n": 0}


async def test_conformance_suite_through_pgbouncer(db: str, pgbouncer: PgBouncer) -> None:
    via = pgbouncer.dsn_for(db)

    @checkpointer_test(name="DeterministicSaver via PgBouncer")
    async def factory() -> AsyncIterator[DeterministicSaver]:
        async with AsyncConnectionPool(via, min_size=2, max_size=8, kwargs=BOUNCER_KWARGS) as pool:
            yield DeterministicSaver(pool, run_id_policy="off")

    report = await validate(factory)
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if result is not None and not result.passed
    }
    assert report.passed_all(), failures


async def test_retry_contract_through_pgbouncer(db: str, pgbouncer: PgBouncer) -> None:
    """A retried run applies its input once; a retry with another input is refused; two
    attempts racing on one run: one wins, the other is fenced. All through the bouncer,
    where consecutive statements land on different server sessions."""
    async with AsyncConnectionPool(
        pgbouncer.dsn_for(db), min_size=2, max_size=8, kwargs=BOUNCER_KWARGS
    ) as pool:
        saver = DeterministicSaver(pool)
        graph = build_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bouncer-retry"}}
        await graph.ainvoke(first_input(), run_config("bouncer-retry", "r1"))
        # The retry of the same call: nothing is re-applied.
        await graph.ainvoke(first_input(), run_config("bouncer-retry", "r1"))
        state = await graph.aget_state(config)
        assert [m.content for m in state.values["messages"]] == ["hello", "planning", "polished"]
        with pytest.raises(RunInputMismatchError):
            await graph.ainvoke({"messages": [("user", "other")]}, run_config("bouncer-retry", "r1"))
        # Two deliveries of the same resume at once: the thread ends up resumed once.
        results = await asyncio.gather(
            graph.ainvoke(Command(resume="yes"), run_config("bouncer-retry", "r2")),
            graph.ainvoke(Command(resume="yes"), run_config("bouncer-retry", "r2")),
            return_exceptions=True,
        )
        assert any(not isinstance(r, BaseException) for r in results), results
        final = await graph.aget_state(config)
        assert [m.content for m in final.values["messages"]] == [
            "hello",
            "planning",
            "polished",
            "done: yes",
        ]
        assert final.next == ()


def test_wrong_password_through_pgbouncer_names_the_reason(db: str, pgbouncer: PgBouncer) -> None:
    bad = psycopg.conninfo.make_conninfo(pgbouncer.dsn_for(db), password="wrong")
    saver = DeterministicSaver(bad, prepare_threshold=None)  # no `with`: first use connects
    with pytest.raises(DatabaseAccessError, match="authentication failed") as caught:
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert not is_retryable(caught.value)  # through the pooler too
    saver.close()


def test_cli_migrate_through_pgbouncer(
    pg_server_dsn: str, pgbouncer: PgBouncer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`langgraph-deterministic migrate` pointed at the bouncer: refused with the fix while
    migrations are pending, "up to date" once they were applied directly."""
    from langgraph_deterministic.cli import main

    fresh = make_database(pg_server_dsn, prefix="lgd_bouncer_cli")
    try:
        assert main(["migrate", "--dsn", pgbouncer.dsn_for(fresh)]) == 2  # a configuration error
        assert "direct connection" in capsys.readouterr().err
        assert main(["migrate", "--dsn", fresh]) == 0
        capsys.readouterr()
        assert main(["migrate", "--dsn", pgbouncer.dsn_for(fresh)]) == 0
        assert "up to date" in capsys.readouterr().out
        assert _advisory_locks(fresh) == 0
    finally:
        drop_database(pg_server_dsn, database_name(fresh))
