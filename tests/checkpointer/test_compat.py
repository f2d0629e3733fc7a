"""One database, two savers: what PostgresSaver wrote, DeterministicSaver reads, resumes and
extends, and the reverse. A real graph: message state, a Send fan-out, a subgraph, an
interrupt."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row

from langgraph_deterministic import DeterministicSaver

from .graphs import build_graph, first_input


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    # Each set-up must leave the other's schema working: run both.
    with Connection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@contextmanager
def sync_saver(kind: str, dsn: str) -> Iterator[BaseCheckpointSaver[Any]]:
    if kind == "peer":
        with Connection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            yield PostgresSaver(conn)
    else:
        with DeterministicSaver(dsn, run_id_policy="off") as saver:
            yield saver


@asynccontextmanager
async def async_saver(kind: str, dsn: str) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if kind == "peer":
        async with await AsyncConnection.connect(
            dsn, autocommit=True, row_factory=dict_row
        ) as conn:
            yield AsyncPostgresSaver(conn)
    else:
        async with DeterministicSaver(dsn, run_id_policy="off") as saver:
            yield saver


def cfg(thread: str, run_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}, "metadata": {"run_id": run_id}}


def _views(graph: Any, saver: BaseCheckpointSaver[Any], thread: str) -> dict[str, Any]:
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    head = saver.get_tuple(config)
    assert head is not None
    return {
        "state": graph.get_state(config, subgraphs=True),
        "history": list(graph.get_state_history(config)),
        "pending_writes": head.pending_writes,
        "subgraph_checkpoints": sorted(
            t.config["configurable"]["checkpoint_ns"]
            for t in saver.list(None, filter={"run_id": "run-1"})
        ),
    }


@pytest.mark.parametrize(("writer", "reader"), [("peer", "ours"), ("ours", "peer")])
def test_sync_cross_compatibility(db: str, writer: str, reader: str) -> None:
    thread = f"sync-{writer}-then-{reader}"
    with sync_saver(writer, db) as first, sync_saver(reader, db) as second:
        g1 = build_graph().compile(checkpointer=first)
        g2 = build_graph().compile(checkpointer=second)
        g1.invoke(first_input(), cfg(thread, "run-1"))
        seen_by_writer = _views(g1, first, thread)
        seen_by_reader = _views(g2, second, thread)
        assert seen_by_reader == seen_by_writer
        state = seen_by_reader["state"]
        assert state.next == ("ask",)
        asked = state.tasks[0].interrupts[0].value["results"]
        assert {"did part-0", "did part-1", "did part-2", "summary of 3"} <= set(asked)
        assert len(seen_by_reader["history"]) == 5  # input, plan, work, sub, ask

        # The other saver resumes the interrupted run and completes it...
        final = g2.invoke(Command(resume="yes"), cfg(thread, "run-2"))
        assert final["approved"] == "yes"
        assert [m.content for m in final["messages"]] == [
            "hello",
            "planning",
            "polished",
            "done: yes",
        ]
        # ...and the first saver sees exactly the same completed thread.
        assert _views(g1, first, thread)["history"] == _views(g2, second, thread)["history"]
        assert g1.get_state({"configurable": {"thread_id": thread}}).next == ()


@pytest.mark.parametrize(("writer", "reader"), [("peer", "ours"), ("ours", "peer")])
async def test_async_cross_compatibility(db: str, writer: str, reader: str) -> None:
    thread = f"async-{writer}-then-{reader}"
    async with async_saver(writer, db) as first, async_saver(reader, db) as second:
        g1 = build_graph().compile(checkpointer=first)
        g2 = build_graph().compile(checkpointer=second)
        await g1.ainvoke(first_input(), cfg(thread, "run-1"))
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        s1 = await g1.aget_state(config, subgraphs=True)
        s2 = await g2.aget_state(config, subgraphs=True)
        assert s1 == s2
        h1 = [s async for s in g1.aget_state_history(config)]
        h2 = [s async for s in g2.aget_state_history(config)]
        assert h1 == h2
        t1, t2 = await first.aget_tuple(config), await second.aget_tuple(config)
        assert t1 is not None and t2 is not None
        assert t1.pending_writes == t2.pending_writes
        final = await g2.ainvoke(Command(resume="ok"), cfg(thread, "run-2"))
        assert final["approved"] == "ok"
        h1 = [s async for s in g1.aget_state_history(config)]
        h2 = [s async for s in g2.aget_state_history(config)]
        assert h1 == h2
        assert h1[0].values["messages"][-1].content == "done: ok"
