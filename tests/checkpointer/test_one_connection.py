"""A saver over one ``AsyncConnection`` (LangGraph's documented ``autocommit=True,
prepare_threshold=0, row_factory=dict_row``), and the sync API over it.

One connection is shared by every call of the saver, one call at a time: graph runs on
several threads at once, and a run queued behind another on the same thread
(``multitask_strategy="enqueue"``) must not starve the run it waits for. The sync
methods work from any thread but the event loop's, as AsyncPostgresSaver's do."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.checkpointer.saver import SyncCallOnLoopError

KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def build(gate: asyncio.Event | None = None) -> Any:
    from langgraph.graph import END, START, StateGraph

    async def gated(state: State) -> dict[str, Any]:
        assert gate is not None
        await gate.wait()
        return {"log": ["first"]}

    def first(state: State) -> dict[str, Any]:
        return {"log": ["first"]}

    def second(state: State) -> dict[str, Any]:  # a sync node: LangGraph runs it in a thread
        return {"log": ["second"]}

    graph = StateGraph(State)
    graph.add_node("first", gated if gate is not None else first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    return graph



@pytest.fixture
async def conn(db: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await AsyncConnection.connect(db, **KWARGS) as c:
        yield c


async def test_concurrent_runs_on_many_threads_share_the_connection(
    conn: AsyncConnection[Any],
) -> None:
    saver = DeterministicSaver(conn)
    graph = build().compile(checkpointer=saver)
    outs = await asyncio.gather(
        *(graph.ainvoke({"log": [f"in-{i}"]}, run_config(f"many-{i}", "r1")) for i in range(8))
    )
    assert [o["log"] for o in outs] == [[f"in-{i}", "first", "second"] for i in range(8)]
    for i in range(8):
        history = [
            s async for s in graph.aget_state_history({"configurable": {"thread_id": f"many-{i}"}})
        ]
        assert len(history) == 4
        run = await saver.aget_run(f"many-{i}", "r1")
        assert run is not None and run.attempts == 1


async def test_a_queued_run_on_one_connection_does_not_starve_the_holder(
    conn: AsyncConnection[Any],
) -> None:
    """Run B waits in the queue of the thread run A holds. A's next write needs the one
    connection, so B must not keep it while it waits: A finishes, releases, and B runs."""
    gate = asyncio.Event()
    saver = DeterministicSaver(conn, enqueue_timeout=20)
    graph = build(gate).compile(checkpointer=saver)
    a = asyncio.create_task(graph.ainvoke({"log": ["a"]}, run_config("queue", "run-a")))
    while (await saver.aget_run("queue", "run-a")) is None:  # A holds the thread
        await asyncio.sleep(0.02)
    b = asyncio.create_task(
        graph.ainvoke({"log": ["b"]}, run_config("queue", "run-b", multitask_strategy="enqueue"))
    )
    await asyncio.sleep(0.5)  # B is in the queue, waiting
    assert not b.done()
    gate.set()
    out_a = await asyncio.wait_for(a, 10)  # before the fix: blocked until B's timeout
    out_b = await asyncio.wait_for(b, 10)
    assert out_a["log"] == ["a", "first", "second"]
    assert out_b["log"] == ["a", "first", "second", "b", "first", "second"]
    run_b = await saver.aget_run("queue", "run-b")
    assert run_b is not None and run_b.multitask_outcome == "enqueued"


def test_a_queued_run_on_one_sync_connection_does_not_starve_the_holder(db: str) -> None:
    """The same with one sync ``Connection`` shared by two threads."""
    from concurrent.futures import ThreadPoolExecutor

    from langgraph.graph import END, START, StateGraph
    from psycopg import Connection

    gate = threading.Event()

    def first(state: State) -> dict[str, Any]:
        gate.wait(30)
        return {"log": ["first"]}

    graph = StateGraph(State)
    graph.add_node("first", first)
    graph.add_edge(START, "first")
    graph.add_edge("first", END)
    with Connection.connect(db, **KWARGS) as conn, ThreadPoolExecutor(2) as pool:
        saver = DeterministicSaver(conn, enqueue_timeout=20)
        app = graph.compile(checkpointer=saver)
        a = pool.submit(app.invoke, {"log": ["a"]}, run_config("sync-queue", "run-a"))
        while saver.get_run("sync-queue", "run-a") is None:
            time.sleep(0.02)
        b = pool.submit(
            app.invoke,
            {"log": ["b"]},
            run_config("sync-queue", "run-b", multitask_strategy="enqueue"),
        )
        time.sleep(0.5)
        assert not b.done()
        gate.set()
        assert a.result(10)["log"] == ["a", "first"]
        assert b.result(10)["log"] == ["a", "first", "b", "first"]


async def test_sync_api_from_another_thread_before_any_async_call(
    conn: AsyncConnection[Any],
) -> None:
    """A saver built on the loop, used first through its sync API from a worker thread
    (graph.invoke / get_state in asyncio.to_thread), as AsyncPostgresSaver allows."""
    saver = DeterministicSaver(conn)
    graph = build().compile(checkpointer=saver)
    out = await asyncio.to_thread(graph.invoke, {"log": ["s"]}, run_config("sync-first", "r1"))
    assert out["log"] == ["s", "first", "second"]
    state = await asyncio.to_thread(graph.get_state, {"configurable": {"thread_id": "sync-first"}})
    assert state.values["log"] == ["s", "first", "second"]
    listed = await asyncio.to_thread(
        lambda: list(saver.list({"configurable": {"thread_id": "sync-first"}}))
    )
    assert len(listed) == 4


async def test_sync_api_on_the_event_loop_itself_is_refused_clearly(
    conn: AsyncConnection[Any],
) -> None:
    saver = DeterministicSaver(conn)
    await saver.aget_tuple({"configurable": {"thread_id": "x"}})
    with pytest.raises(SyncCallOnLoopError, match="async API") as caught:
        saver.get_tuple({"configurable": {"thread_id": "x"}})
    assert isinstance(caught.value, asyncio.InvalidStateError)  # as AsyncPostgresSaver raises


def test_sync_api_after_the_loop_is_gone_is_refused_clearly(db: str) -> None:
    async def make() -> DeterministicSaver:
        conn = await AsyncConnection.connect(db, **KWARGS)
        saver = DeterministicSaver(conn)
        await saver.aget_tuple({"configurable": {"thread_id": "x"}})
        await conn.close()
        return saver

    saver = asyncio.run(make())
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            saver.get_tuple({"configurable": {"thread_id": "x"}})
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    worker.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], SyncCallOnLoopError)
