"""The server's own work per graph run, pinned: rows written, buffers touched, WAL bytes.

Round trips and statements per run are pinned in test_rows.py; they say what the client
sends, not what each statement costs the server. These pins catch a contract fix that
doubles the server's work with the same statements (an extra index, a row per write, an
update per superstep): counts from the server's own statistics views, not timings.

The graph is small and fixed (4 nodes, a 3-way ``Send`` fan-out, a join: 7 supersteps, 8
checkpoints), run on fresh threads with sequential ids in a database of its own, so index
depth and page state follow the same path on every run of the test.

- Rows inserted / updated / deleted per run (``pg_stat_user_tables``): exact. A row is
  written or it is not; no page state moves these.
- Buffers touched per run (heap, index and TOAST blocks hit or read in this database's
  tables, ``pg_statio_user_tables``): deterministic but for a page split or a HOT chain
  pruned at another moment. Measured: a minimum over the 3 runs of 343-349 on PostgreSQL
  15, 16 and 18, each run within 2% of it. Bound: 356 (the highest + 2%). One planted
  primary-key probe per put adds 16 (8 puts x 2 blocks) and fails it.
- WAL bytes per run (the insert position's advance): varies with page state (a full-page
  image after a checkpoint, a new heap or index page), and the position is server-wide.
  The minimum over the 3 runs sheds a checkpoint's full-page images (one run in ten read
  +8 KB) and other databases' work. Measured: 34.6-35.2 KB; bound 36,000 (+2.5%).

The bounds are upper bounds: the next change that lowers the work should lower them too.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from psycopg.rows import dict_row
from tests.conftest import make_database

from devtools import server_work
from devtools.postgres import database_name, drop_database
from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config

# LangGraph's documented connection settings
SETTINGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}

RUNS_BEFORE = 4  # fills the first index pages: the measured runs see 2-level indexes
MEASURED = 3

# Per run of the graph below, measured on PostgreSQL 15, 16 and 18 (see the module docstring).
ROWS = {"inserted": 47, "updated": 9, "deleted": 0}
BUFFERS_BOUND = 356
WAL_BOUND = 36_000


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    parts: Annotated[list[str], operator.add]


def _reply(tag: str) -> dict[str, Any]:
    return {"messages": [AIMessage(f"{tag} " + "x" * 300)]}


def build() -> StateGraph[State]:
    builder: StateGraph[State] = StateGraph(State)
    previous = START
    for i in range(4):
        builder.add_node(f"n{i}", lambda s, i=i: _reply(f"n{i}"))
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_node("worker", lambda arg: {"parts": [f"w{arg['k']}"]})
    builder.add_node("join", lambda s: _reply("join"))
    builder.add_conditional_edges(
        previous, lambda s: [Send("worker", {"k": k}) for k in range(3)], ["worker"]
    )
    builder.add_edge("worker", "join")
    builder.add_edge("join", END)
    return builder


@pytest.fixture
def fresh(pg_server_dsn: str) -> Iterator[str]:
    db = make_database(pg_server_dsn, prefix="lgd_server_work")
    try:
        with DeterministicSaver(db) as saver:
            saver.setup()
        yield db
    finally:
        drop_database(pg_server_dsn, database_name(db))


def per_run(db: str, sync: bool) -> list[server_work.ServerWork]:
    """The server's work of each of MEASURED graph runs after RUNS_BEFORE."""
    import asyncio

    out: list[server_work.ServerWork] = []
    if sync:
        with psycopg.connect(db, **SETTINGS) as conn:
            graph = build().compile(checkpointer=DeterministicSaver(conn))
            for n in range(RUNS_BEFORE + MEASURED):
                config = run_config(f"work-{n:04d}", f"run-{n}")

                def work(config: Any = config) -> None:
                    out_ = graph.invoke({"messages": [HumanMessage("q" * 2000)]}, config)
                    assert len(out_["parts"]) == 3
                    server_work.flush(conn)

                measured = server_work.measure(db, work)
                if n >= RUNS_BEFORE:
                    out.append(measured)
        return out

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db, **SETTINGS) as conn:
            graph = build().compile(checkpointer=DeterministicSaver(conn))
            loop = asyncio.get_running_loop()
            for n in range(RUNS_BEFORE + MEASURED):
                config = run_config(f"work-{n:04d}", f"run-{n}")

                async def work(config: Any = config) -> None:
                    out_ = await graph.ainvoke({"messages": [HumanMessage("q" * 2000)]}, config)
                    assert len(out_["parts"]) == 3
                    await server_work.flush(conn)

                # measure() blocks: it runs in a thread, the run on this loop
                def blocking(work: Any = work) -> None:
                    asyncio.run_coroutine_threadsafe(work(), loop).result()

                measured = await asyncio.to_thread(server_work.measure, db, blocking)
                if n >= RUNS_BEFORE:
                    out.append(measured)

    asyncio.run(main())
    return out


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_server_work_per_graph_run_is_bounded(fresh: str, sync: bool) -> None:
    runs = per_run(fresh, sync)
    with psycopg.connect(fresh) as conn:
        counters = server_work.has_table_counters(conn)
        version = conn.info.server_version
    wal = min(r.wal_bytes for r in runs)
    print(version, {"wal": [r.wal_bytes for r in runs], "buffers": [r.buffers for r in runs],
           "rows": [(r.inserted, r.updated, r.deleted) for r in runs]})  # fmt: skip
    assert wal <= WAL_BOUND, f"WAL bytes per run {wal} > {WAL_BOUND}: {runs}"
    if not counters:  # PostgreSQL 14 publishes table counters only now and then
        return
    for r in runs:
        assert {"inserted": r.inserted, "updated": r.updated, "deleted": r.deleted} == ROWS
    buffers = min(r.buffers or 0 for r in runs)
    assert buffers <= BUFFERS_BOUND, f"buffers per run {buffers} > {BUFFERS_BOUND}: {runs}"
