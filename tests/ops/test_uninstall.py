"""``langgraph-deterministic uninstall``: back to PostgresSaver.

A database after weeks of use (PostgresSaver's threads, then our migrations, runs of ours
finished, interrupted and killed, a journal, repairs) is uninstalled; afterwards its
catalog equals that of a database where only ``PostgresSaver.setup()`` ran, and
PostgresSaver, sync and async, reads and continues every thread. Uninstall refuses while a
run of ours holds a live lease, waits for its locks as migrations do, and its dry run
prints exactly what it then runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from tests.ops import _agent, _plant

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.cli import main
from langgraph_deterministic.errors import SchemaNotReadyError
from langgraph_deterministic.ops.uninstall import our_peer_indexes, uninstall
from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal, durable_sync

CATALOG = {
    "relations": "SELECT c.relkind::text, c.relname FROM pg_class c JOIN pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = 'public'",
    "indexes": "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
    "i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = 'public'",
    "functions": "SELECT p.prokind::text, p.proname || '(' || "
    "pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p JOIN pg_namespace n "
    "ON n.oid = p.pronamespace WHERE n.nspname = 'public'",
    "types": "SELECT t.typtype::text, t.typname FROM pg_type t JOIN pg_namespace n "
    "ON n.oid = t.typnamespace WHERE n.nspname = 'public'",
    "triggers": "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal",
    "columns": "SELECT c.relname, a.attname || ' ' || format_type(a.atttypid, a.atttypmod) "
    "|| ' ' || a.attnotnull::text || ' ' || a.attcompression::text || ' ' || "
    "coalesce(pg_get_expr(d.adbin, d.adrelid), '') FROM pg_attribute a "
    "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped",
    "constraints": "SELECT conrelid::regclass::text, conname || ' ' || "
    "pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
    "peer_versions": "SELECT v, '' FROM checkpoint_migrations",
}


def catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {k: sorted(conn.execute(q).fetchall()) for k, q in CATALOG.items()}  # type: ignore[arg-type]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


class Order(TypedDict, total=False):
    order: str
    receipt: str


def _checkout() -> StateGraph[Any]:
    def charge(state: Order) -> Order:
        return {"receipt": durable_sync("charge", lambda o: f"paid {o}", state["order"])}

    graph = StateGraph(Order)
    graph.add_node("charge", charge)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    return graph


@pytest.fixture(scope="module")
def used(pg_server_dsn: str) -> Iterator[dict[str, Any]]:
    """A database after weeks of use, and a PostgresSaver-only one to compare with."""
    dsn = create_database(pg_server_dsn, prefix="lgd_used")
    peer_only = create_database(pg_server_dsn, prefix="lgd_peer")
    try:
        for target in (dsn, peer_only):
            with PostgresSaver.from_conn_string(target) as saver:
                saver.setup()
        world: dict[str, Any] = {"dsn": dsn, "peer_only": catalog(peer_only)}
        kinds = _plant.plant_peer(dsn, "tuple")  # before: PostgresSaver's own threads
        assert cli("migrate", "--dsn", dsn)[0] == 0
        kinds |= _plant.plant_ours(dsn, "dict")  # a run of ours killed in its tool
        with DeterministicSaver(dsn) as saver:
            graph = _agent.build().compile(checkpointer=saver)
            for n in range(3):  # finished runs, one interrupted
                text = "please approve it" if n == 2 else f"question {n}"
                graph.invoke({"messages": [("user", text)]}, run_config(f"ours-{n}", "r1"))
                kinds[f"ours-{n}"] = "interrupted" if n == 2 else "done"
            runner = DeterministicRunner(journal=PostgresJournal(saver))
            shop = _checkout().compile(checkpointer=saver)
            for n in range(2):
                out = runner.invoke(shop, {"order": f"o{n}"}, run_config(f"shop-{n}", "r1"))
                assert out["receipt"] == f"paid o{n}"
                kinds[f"shop-{n}"] = "shop"
        assert cli("repair", "--dsn", dsn, "--apply", "--idle", "0")[0] == 0
        with psycopg.connect(dsn) as conn:
            world["rows"] = {
                t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                for t in ("lgd_runs", "lgd_journal", "lgd_repairs", "lgd_chain")
            }
        world["kinds"] = kinds
        yield world
    finally:
        drop_database(pg_server_dsn, database_name(dsn))
        drop_database(pg_server_dsn, database_name(peer_only))


def test_our_index_on_the_peers_table_is_derived_from_the_migrations() -> None:
    assert our_peer_indexes() == {"checkpoints_run_id_idx"}


def test_uninstall_after_weeks_of_use(used: dict[str, Any]) -> None:
    dsn = used["dsn"]
    assert all(n > 0 for n in used["rows"].values()), used["rows"]

    # a run of ours in progress holds its thread's lease: uninstall refuses, names the fix
    meet = threading.Barrier(2)
    _agent.MEET.append(meet)
    with DeterministicSaver(dsn) as saver, ThreadPoolExecutor(1) as pool:
        graph = _agent.build().compile(checkpointer=saver)
        live = pool.submit(
            graph.invoke, {"messages": [("user", "slow")]}, run_config("ours-live", "r1")
        )
        try:
            code, out, err = cli("uninstall", "--dsn", dsn, "--dry-run")
            assert code == 0 and "refused when run now: 1 thread(s) are leased" in out
            code, _, err = cli("uninstall", "--dsn", dsn)
            assert code == 1
            assert "1 thread(s) are leased by runs of ours still in progress: ours-live" in err
            assert "Fix: stop those workers" in err and "--force" in err
            assert "Nothing was changed" in err
        finally:
            meet.wait(timeout=30)
            _agent.MEET.clear()
        live.result(timeout=60)
    used["kinds"]["ours-live"] = "done"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('lgd_runs') IS NOT NULL").fetchone() == (True,)

    # the dry run prints exactly the statements the uninstall then runs
    code, printed, _ = cli("uninstall", "--dsn", dsn, "--dry-run")
    assert code == 0 and "nothing changed" in printed
    report = uninstall(dsn)
    assert report.steps and all(f"{s.sql};" in printed for s in report.steps)
    assert printed.count(";\n") == len(report.steps)
    assert report.steps[0].sql.endswith('"langgraph_deterministic_migrations"')  # first
    assert catalog(dsn) == used["peer_only"]  # nothing of ours is left, nothing else moved

    # PostgresSaver's own setup has nothing to do, and a second uninstall neither
    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    assert catalog(dsn) == used["peer_only"]
    code, out, _ = cli("uninstall", "--dsn", dsn)
    assert code == 0 and "nothing of ours in this database" in out

    # PostgresSaver, sync for half the threads and async for the rest, continues each one
    threads = sorted(used["kinds"])
    half = len(threads) // 2
    with PostgresSaver.from_conn_string(dsn) as saver:
        for tid in threads[:half]:
            _continue_sync(saver, tid, used["kinds"][tid])
    asyncio.run(_continue_async(dsn, {t: used["kinds"][t] for t in threads[half:]}))


def _next_input(tid: str, kind: str) -> Any:
    if kind == "interrupted":
        return Command(resume="yes")
    if kind == "shop":
        return {"order": f"{tid}-again"}
    return {"messages": [("user", f"and now, {tid}?")]}


def _check(tid: str, kind: str, values: dict[str, Any], state_next: tuple[str, ...]) -> None:
    assert not state_next, tid
    if kind == "shop":
        assert values["receipt"] == f"paid {tid}-again"
        return
    last = values["messages"][-1]
    assert isinstance(last, AIMessage) and str(last.content).startswith("Answer"), (tid, last)


def _continue_sync(saver: PostgresSaver, tid: str, kind: str) -> None:
    graph = (_checkout() if kind == "shop" else _agent.build()).compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": tid}}
    assert graph.get_state(cfg).values, tid  # it reads the thread
    graph.invoke(_next_input(tid, kind), cfg)
    state = graph.get_state(cfg)
    _check(tid, kind, state.values, state.next)


async def _continue_async(dsn: str, kinds: dict[str, str]) -> None:
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        for tid, kind in sorted(kinds.items()):
            graph = (_checkout() if kind == "shop" else _agent.build()).compile(
                checkpointer=saver
            )
            cfg: Any = {"configurable": {"thread_id": tid}}
            assert (await graph.aget_state(cfg)).values, tid
            await graph.ainvoke(_next_input(tid, kind), cfg)
            state = await graph.aget_state(cfg)
            _check(tid, kind, state.values, state.next)


def test_uninstall_waits_for_its_locks_as_migrations_do(pg_server_dsn: str) -> None:
    dsn = create_database(pg_server_dsn, prefix="lgd_unlock")
    try:
        with DeterministicSaver(dsn) as saver:
            saver.setup()
        with psycopg.connect(dsn) as blocker:
            blocker.execute("SELECT count(*) FROM lgd_runs")  # an open transaction reads it
            code, _, err = cli(
                "uninstall", "--dsn", dsn, "--lock-timeout", "0.05", "--lock-retries", "2"
            )
            assert code == 1
            assert "could not get the lock it needs to remove our" in err
            assert "within lock_timeout 50ms, 3 times" in err and "Oldest open transactions" in err
            assert "run uninstall again" in err
        # the bookkeeping went first: migrate would bring everything back; uninstall
        # finishes the job
        with psycopg.connect(dsn) as conn:
            assert conn.execute(
                "SELECT to_regclass('langgraph_deterministic_migrations')"
            ).fetchone() == (None,)
        code, out, _ = cli("uninstall", "--dsn", dsn)
        assert code == 0 and "removed our" in out
        with psycopg.connect(dsn) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_class WHERE relname LIKE 'lgd\\_%'"
            ).fetchone() == (0,)
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def test_force_removes_under_a_live_run_whose_next_write_then_fails(pg_server_dsn: str) -> None:
    dsn = create_database(pg_server_dsn, prefix="lgd_force")
    meet = threading.Barrier(2)
    try:
        with DeterministicSaver(dsn) as saver:
            saver.setup()
        _agent.MEET.append(meet)
        with DeterministicSaver(dsn) as saver, ThreadPoolExecutor(1) as pool:
            graph = _agent.build().compile(checkpointer=saver)
            live = pool.submit(
                graph.invoke, {"messages": [("user", "slow")]}, run_config("live", "r1")
            )
            try:
                _wait_for_lease(dsn)  # the run holds the thread (its tool waits at `meet`)
                assert cli("uninstall", "--dsn", dsn)[0] == 1  # refused: a live lease
                code, out, _ = cli("uninstall", "--dsn", dsn, "--force")
                assert code == 0 and "removed our" in out
            finally:
                meet.wait(timeout=30)
                _agent.MEET.clear()
            # the worker's next write fails, naming what is missing, and writes nothing
            with pytest.raises(SchemaNotReadyError, match="lgd_chain"):
                live.result(timeout=60)
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def _wait_for_lease(dsn: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM lgd_leases").fetchone() == (0,):
            assert time.monotonic() < deadline, "the live run never took the thread's lease"
            time.sleep(0.02)
