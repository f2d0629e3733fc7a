"""Real graphs the saver tests run: message state, a Send fan-out, a subgraph, an interrupt."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send, interrupt


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    results: Annotated[list[str], operator.add]
    approved: str
    topic: str


class SubState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    results: Annotated[list[str], operator.add]


def _summarise(state: SubState) -> dict[str, Any]:
    return {"results": [f"summary of {len(state.get('results', []))}"]}


def _polish(state: SubState) -> dict[str, Any]:
    return {"messages": [AIMessage(content="polished", id="polished")]}


def build_graph() -> StateGraph[Any]:
    sub = StateGraph(SubState)
    sub.add_node("summarise", _summarise)
    sub.add_node("polish", _polish)
    sub.add_edge(START, "summarise")
    sub.add_edge("summarise", "polish")
    sub.add_edge("polish", END)

    def plan(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(content="planning", id="plan")]}

    def fan_out(state: State) -> list[Send]:
        return [Send("work", {"topic": f"part-{i}"}) for i in range(3)]

    def work(state: State) -> dict[str, Any]:
        return {"results": [f"did {state['topic']}"]}

    def ask(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "approve?", "results": sorted(state["results"])})
        return {"approved": answer}

    def finish(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"done: {state['approved']}", id="done")]}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("work", work)
    graph.add_node("sub", sub.compile())
    graph.add_node("ask", ask)
    graph.add_node("finish", finish)
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", fan_out, ["work"])
    graph.add_edge("work", "sub")
    graph.add_edge("sub", "ask")
    graph.add_edge("ask", "finish")
    graph.add_edge("finish", END)
    return graph


def first_input() -> dict[str, Any]:
    return {"messages": [HumanMessage(content="hello", id="hello")]}
