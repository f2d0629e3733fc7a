"""The scenario every drop-in test runs, sync and async: setup, a graph run that stops at an
interrupt, the resume, the state history, and list with filters. The graph is the one of
``graphs.py`` (a Send fan-out, a subgraph, an interrupt) under the retry contract."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from langgraph_deterministic import DeterministicSaver, run_config

from .graphs import build_graph, first_input

# input, plan, work, sub, ask (interrupted); the resume adds ask and finish
HISTORY_AT_INTERRUPT = 5
HISTORY_FINAL = 7
ASKED = {"did part-0", "did part-1", "did part-2", "summary of 3"}
FINAL_MESSAGES = ["hello", "planning", "polished", "done: yes"]


def _thread(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def _check_listing(listed: list[Any], by_run: list[Any], sources: list[Any], thread: str) -> None:
    assert len(listed) == HISTORY_FINAL, [t.metadata for t in listed]
    assert {t.config["configurable"]["thread_id"] for t in listed} == {thread}
    assert by_run and {t.metadata["run_id"] for t in by_run} == {f"{thread}:resume"}
    assert [t.metadata["source"] for t in sources] == ["input"]


def run_sync(saver: DeterministicSaver, thread: str) -> None:
    saver.setup()
    graph = build_graph().compile(checkpointer=saver)
    graph.invoke(first_input(), run_config(thread, f"{thread}:start"))
    state = graph.get_state(_thread(thread))
    assert state.next == ("ask",)
    assert set(state.tasks[0].interrupts[0].value["results"]) >= ASKED
    assert len(list(graph.get_state_history(_thread(thread)))) == HISTORY_AT_INTERRUPT
    final = graph.invoke(Command(resume="yes"), run_config(thread, f"{thread}:resume"))
    assert [m.content for m in final["messages"]] == FINAL_MESSAGES
    history = list(graph.get_state_history(_thread(thread)))
    assert len(history) == HISTORY_FINAL
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    _check_listing(
        list(saver.list(cfg)),
        list(saver.list(cfg, filter={"run_id": f"{thread}:resume"})),
        list(saver.list(cfg, filter={"source": "input"}, before=history[0].config, limit=1)),
        thread,
    )


async def run_async(saver: DeterministicSaver, thread: str) -> None:
    await saver.asetup()
    graph = build_graph().compile(checkpointer=saver)
    await graph.ainvoke(first_input(), run_config(thread, f"{thread}:start"))
    state = await graph.aget_state(_thread(thread))
    assert state.next == ("ask",)
    assert set(state.tasks[0].interrupts[0].value["results"]) >= ASKED
    history = [s async for s in graph.aget_state_history(_thread(thread))]
    assert len(history) == HISTORY_AT_INTERRUPT
    final = await graph.ainvoke(Command(resume="yes"), run_config(thread, f"{thread}:resume"))
    assert [m.content for m in final["messages"]] == FINAL_MESSAGES
    history = [s async for s in graph.aget_state_history(_thread(thread))]
    assert len(history) == HISTORY_FINAL
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    _check_listing(
        [t async for t in saver.alist(cfg)],
        [t async for t in saver.alist(cfg, filter={"run_id": f"{thread}:resume"})],
        [
            t
            async for t in saver.alist(
                cfg, filter={"source": "input"}, before=history[0].config, limit=1
            )
        ],
        thread,
    )
