"""The one-class swap, mid-conversation: the same graph on the same database, alternately
through langgraph's PostgresSaver / AsyncPostgresSaver on its documented pool settings and
through DeterministicSaver on the SAME pool object. Each saver reads what the other wrote
and continues the other's thread: the interrupted run started by one is resumed by the
other, then the next turn goes the other way round."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic import DeterministicSaver, run_config

from .graphs import build_graph, first_input

# What PostgresSaver.from_conn_string opens and LangGraph's docs tell users to pass.
PEER_KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs=PEER_KWARGS) as pool:
        PostgresSaver(pool).setup()  # type: ignore[arg-type]
        DeterministicSaver(pool).setup()
    return dsn


def _turn(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=f"turn {n}", id=f"turn-{n}")]}


def _contents(state: Any) -> list[str]:
    return [m.content for m in state.values["messages"]]


def test_alternating_on_one_pool(db: str) -> None:
    thread = "alternate-sync"
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    with ConnectionPool(db, min_size=1, max_size=4, kwargs=PEER_KWARGS) as pool:
        peer = build_graph().compile(checkpointer=PostgresSaver(pool))  # type: ignore[arg-type]
        ours = build_graph().compile(checkpointer=DeterministicSaver(pool, run_id_policy="warn"))

        peer.invoke(first_input(), run_config(thread, "t1"))
        assert ours.get_state(config) == peer.get_state(config)
        assert ours.get_state(config).next == ("ask",)
        ours.invoke(Command(resume="yes"), run_config(thread, "t1-resume"))
        assert list(peer.get_state_history(config)) == list(ours.get_state_history(config))
        assert _contents(peer.get_state(config))[-1] == "done: yes"

        ours.invoke(_turn(2), run_config(thread, "t2"))
        assert peer.get_state(config) == ours.get_state(config)
        peer.invoke(Command(resume="again"), run_config(thread, "t2-resume"))
        final = ours.get_state(config)
        assert final.next == ()
        assert final.values["approved"] == "again"
        # The graph's AI messages carry fixed ids: the second turn replaces them in place.
        assert _contents(final) == ["hello", "planning", "polished", "done: again", "turn 2"]
        assert list(peer.get_state_history(config)) == list(ours.get_state_history(config))


async def test_alternating_on_one_async_pool(db: str) -> None:
    thread = "alternate-async"
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    async with AsyncConnectionPool(db, min_size=1, max_size=4, kwargs=PEER_KWARGS) as pool:
        peer = build_graph().compile(checkpointer=AsyncPostgresSaver(pool))  # type: ignore[arg-type]
        ours = build_graph().compile(checkpointer=DeterministicSaver(pool, run_id_policy="warn"))

        await ours.ainvoke(first_input(), run_config(thread, "t1"))
        assert await peer.aget_state(config) == await ours.aget_state(config)
        await peer.ainvoke(Command(resume="yes"), run_config(thread, "t1-resume"))
        await peer.ainvoke(_turn(2), run_config(thread, "t2"))
        assert (await ours.aget_state(config)).next == ("ask",)
        await ours.ainvoke(Command(resume="again"), run_config(thread, "t2-resume"))
        final = await peer.aget_state(config)
        assert final.next == ()
        assert final.values["approved"] == "again"
        assert _contents(final) == ["hello", "planning", "polished", "done: again", "turn 2"]
        h_peer = [s async for s in peer.aget_state_history(config)]
        h_ours = [s async for s in ours.aget_state_history(config)]
        assert h_peer == h_ours and len(h_ours) == 14
