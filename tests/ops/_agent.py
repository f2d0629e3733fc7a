"""A small tool-calling agent for the ops tests, run by real LangGraph on real savers.

* its model validates a conversation as chat providers do: an AIMessage's tool calls must
  all be answered by ToolMessages before any other message, else :class:`ProviderError`
  (the HTTP 400 a provider answers);
* its tool can be "killed": with :data:`KILL` set it raises :class:`WorkerKilled`, a
  ``BaseException`` LangGraph does not catch, so nothing more of the run is written (as
  when a worker's process dies inside the tool);
* with a barrier in :data:`MEET` the tool waits there, so two attempts run the same step
  at once (a zombie and its retry);
* a question containing "approve" makes the tool wait on ``interrupt()``.

Every input form LangGraph accepts for a ``messages`` key is in :data:`FORMS`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt


class ProviderError(Exception):
    """What a chat provider answers to a tool call without its result (HTTP 400)."""


class WorkerKilled(BaseException):
    """The worker died inside the tool (LangGraph writes nothing more for the run)."""


KILL = threading.Event()
#: when set, the tool waits here: two attempts that run the same step meet inside it
MEET: list[threading.Barrier] = []


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def model(messages: list[AnyMessage]) -> AIMessage:
    pending: set[str] = set()
    for message in messages:
        if isinstance(message, ToolMessage):
            pending.discard(message.tool_call_id)
            continue
        if pending:
            raise ProviderError(
                "400 Bad Request: tool_use ids were found without tool_result blocks "
                f"immediately after: {sorted(pending)}"
            )
        if isinstance(message, AIMessage):
            pending = {c["id"] for c in message.tool_calls if c["id"]}
    last = messages[-1]
    if isinstance(last, HumanMessage):
        n = sum(isinstance(m, AIMessage) for m in messages)
        return AIMessage(
            content="",
            tool_calls=[{"name": "lookup", "args": {"question": last.text}, "id": f"call-{n}"}],
        )
    return AIMessage(content=f"Answer: {last.content}")


@tool
def lookup(question: str) -> str:
    """Look the question up."""
    if KILL.is_set():
        raise WorkerKilled()
    if MEET:
        MEET[0].wait(timeout=30)
    if "approve" in question:
        return f"approved: {interrupt('approve?')}"
    return f"found {question}"


def build() -> StateGraph[Any]:
    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model(state["messages"])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph


#: every form a caller may pass under "messages", as a function of the text
FORMS: dict[str, Callable[[str], Any]] = {
    "message": lambda text: [HumanMessage(content=text)],
    "tuple": lambda text: [("user", text)],
    "dict": lambda text: [{"role": "user", "content": text}],
    "string": lambda text: text,
    "content_blocks": lambda text: [{"role": "user", "content": [{"type": "text", "text": text}]}],
    "bare_tuple": lambda text: ("user", text),
}


def texts_of(messages: list[AnyMessage]) -> list[str]:
    """The user's texts in a conversation (content blocks joined)."""
    return [m.text for m in messages if isinstance(m, HumanMessage)]
