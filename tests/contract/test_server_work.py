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
  pruned at another moment. Measured: a minimum over the 3 runs of 343-352 on PostgreSQL
  15, 16 and 18, each run within 2% of it. Bound: 356 (the highest + 1%). One planted
  primary-key probe per put adds 15-16 (8 puts x 2 blocks) and fails it.
- WAL bytes per run (the insert position's advance): varies with page state (a full-page
  image after a checkpoint, a new heap or index page), and the position is server-wide.
  The minimum over the 3 runs sheds a checkpoint's full-page images (one run in ten read
  +8 KB) and other databases' work. Measured: 34.6-35.2 KB; bound 36,000 (+2.5%).

The bounds are upper bounds: the next change that lowers the work should lower them too.
``test_a_planted_statement_fails_the_bounds`` runs the same measurement with one
superfluous statement per put (a primary-key read, a no-op update of the run's lease) and
checks that the bounds refuse it: a pin that cannot fail would guard nothing. The read
fails the buffers bound; the update fails the exact row count (its ~900 bytes of WAL per
run stay within the WAL bound, which catches work of the size of a row per write).
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


# One superfluous statement per put, run on the saver's connection before the put: what a
# contract fix that adds a statement to every superstep would cost the server.
PLANTS = {
    # a primary-key probe of the parent checkpoint: buffers only
    "read": "SELECT 1 FROM checkpoints WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s"
    " AND checkpoint_id = %(id)s",
    # a no-op update of the run's lease: a row updated and its WAL
    "write": "UPDATE lgd_leases SET expires_at = expires_at WHERE thread_id = %(thread)s",
}


class PlantedSaver(DeterministicSaver):
    """DeterministicSaver with one more statement per put, sent on the saver's connection."""

    def __init__(self, conn: psycopg.Connection[Any], statement: str) -> None:
        super().__init__(conn)
        self._planted_conn, self._planted = conn, statement

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        c = config["configurable"]
        params = {"thread": c["thread_id"], "ns": c.get("checkpoint_ns", ""),
                  "id": c.get("checkpoint_id") or ""}  # fmt: skip
        self._planted_conn.execute(self._planted, params)
        return super().put(config, checkpoint, metadata, new_versions)


def per_run(db: str, sync: bool, plant: str | None = None) -> list[server_work.ServerWork]:
    """The server's work of each of MEASURED graph runs after RUNS_BEFORE."""
    import asyncio

    out: list[server_work.ServerWork] = []
    if sync:
        with psycopg.connect(db, **SETTINGS) as conn:
            saver = DeterministicSaver(conn) if plant is None else PlantedSaver(conn, PLANTS[plant])
            graph = build().compile(checkpointer=saver)
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


def violations(runs: list[server_work.ServerWork], counters: bool) -> list[str]:
    """What in ``runs`` exceeds the pins (empty: within them)."""
    out: list[str] = []
    wal = min(r.wal_bytes for r in runs)
    if wal > WAL_BOUND:
        out.append(f"WAL bytes per run {wal} > {WAL_BOUND}")
    if not counters:  # PostgreSQL 14 publishes table counters only now and then
        return out
    for r in runs:
        rows = {"inserted": r.inserted, "updated": r.updated, "deleted": r.deleted}
        if rows != ROWS:
            out.append(f"rows per run {rows} != {ROWS}")
    buffers = min(r.buffers or 0 for r in runs)
    if buffers > BUFFERS_BOUND:
        out.append(f"buffers per run {buffers} > {BUFFERS_BOUND}")
    return out


def _counters(db: str) -> bool:
    with psycopg.connect(db) as conn:
        return server_work.has_table_counters(conn)


def _show(runs: list[server_work.ServerWork]) -> None:
    print({"wal": [r.wal_bytes for r in runs], "buffers": [r.buffers for r in runs],
           "rows": [(r.inserted, r.updated, r.deleted) for r in runs]})  # fmt: skip


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_server_work_per_graph_run_is_bounded(fresh: str, sync: bool) -> None:
    runs = per_run(fresh, sync)
    _show(runs)
    assert violations(runs, _counters(fresh)) == [], runs


@pytest.mark.parametrize(
    ("plant", "caught_by"), [("read", "buffers per run"), ("write", "rows per run")]
)
def test_a_planted_statement_fails_the_bounds(fresh: str, plant: str, caught_by: str) -> None:
    if not _counters(fresh):
        pytest.skip("PostgreSQL 14 publishes table counters only now and then")
    runs = per_run(fresh, sync=True, plant=plant)
    _show(runs)
    found = violations(runs, counters=True)
    assert any(v.startswith(caught_by) for v in found), (plant, found, runs)
