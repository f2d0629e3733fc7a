"""The seed incident (langchain-ai/docs#4070), reproduced and shown impossible.

A tool-calling agent runs under an orchestrator that retries. The pod dies inside the tool
step, after the model's tool call was checkpointed. The retry calls the graph again with the
same input. Without a run id LangGraph applies the input again: the thread now holds a tool
call with no tool result followed by a new user message, and the provider answers 400 for
ever after. The fake provider below enforces that rule exactly as providers do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.rows import dict_row

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import RunIdRequiredError


class ProviderBadRequest(Exception):
    """What a provider SDK raises for HTTP 400."""

    status_code = 400


class FakeProvider(BaseChatModel):
    """A chat model with a provider's validation: every assistant tool call must be
    answered by tool results before anything else. Calls the tool once, then answers."""

    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "fake-provider"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeProvider:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls += 1
        for i, message in enumerate(messages):
            if isinstance(message, AIMessage) and message.tool_calls:
                wanted = {c["id"] for c in message.tool_calls}
                answered: set[str] = set()
                for later in messages[i + 1 :]:
                    if not isinstance(later, ToolMessage):
                        break
                    answered.add(later.tool_call_id)
                if wanted - answered:
                    raise ProviderBadRequest(
                        "400 invalid_request_error: tool_use ids were found without "
                        f"tool_result blocks immediately after: {sorted(wanted - answered)}"
                    )
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"Order status: {messages[-1].content}")
        else:
            reply = AIMessage(
                content="",
                tool_calls=[{"name": "lookup_order", "args": {"order_id": "42"}, "id": "call_42"}],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


class PodKilled(Exception):
    pass


def build_agent(model: FakeProvider, kill_tool_once: list[bool]) -> StateGraph[Any]:
    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        if kill_tool_once and kill_tool_once.pop():
            raise PodKilled("the pod died while the tool ran")
        return f"order {order_id} ships tomorrow"

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.bind_tools([lookup_order]).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup_order], handle_tool_errors=False))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph


USER_INPUT = {"messages": [HumanMessage(content="Where is order 42?")]}


@pytest.fixture
def peer(db: str) -> Iterator[PostgresSaver]:
    with psycopg.connect(db, autocommit=True, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)  # type: ignore[arg-type]
        saver.setup()
        yield saver


def test_the_seed_failure_happens_with_langgraphs_own_saver(peer: PostgresSaver) -> None:
    """The baseline: this is the incident, so the test below could fail."""
    model = FakeProvider()
    graph = build_agent(model, kill_tool_once=[True]).compile(checkpointer=peer)
    config = {"configurable": {"thread_id": "seed-peer"}}
    with pytest.raises(PodKilled):
        graph.invoke(USER_INPUT, config)  # type: ignore[arg-type]
    with pytest.raises(ProviderBadRequest):  # the orchestrator's retry
        graph.invoke(USER_INPUT, config)  # type: ignore[arg-type]
    with pytest.raises(ProviderBadRequest):  # and the thread is stuck for good
        graph.invoke({"messages": [HumanMessage(content="hello?")]}, config)  # type: ignore[arg-type]


def test_the_seed_failure_cannot_happen_with_deterministic_saver(db: str) -> None:
    model = FakeProvider()
    with DeterministicSaver(db) as saver:
        graph = build_agent(model, kill_tool_once=[True]).compile(checkpointer=saver)
        # The same retry, without a run id: refused before anything runs or is written.
        with pytest.raises(RunIdRequiredError):
            graph.invoke(USER_INPUT, {"configurable": {"thread_id": "seed-ours"}})  # type: ignore[arg-type]
        # With run_config (the orchestrator's stable id for this call):
        config = run_config("seed-ours", "workflow-7:initialize-agent")
        with pytest.raises(PodKilled):
            graph.invoke(USER_INPUT, config)
        out = graph.invoke(USER_INPUT, run_config("seed-ours", "workflow-7:initialize-agent"))
        assert [type(m).__name__ for m in out["messages"]] == [
            "HumanMessage",
            "AIMessage",
            "ToolMessage",
            "AIMessage",
        ]
        assert out["messages"][-1].content == "Order status: order 42 ships tomorrow"
        assert model.calls == 2  # the model was not asked again for the tool call
        # And the thread is healthy: the next call works.
        nxt = graph.invoke(
            {"messages": [HumanMessage(content="thanks")]}, run_config("seed-ours", "workflow-8")
        )
        assert len(nxt["messages"]) == 8
        assert nxt["messages"][-1].content == "Order status: order 42 ships tomorrow"
