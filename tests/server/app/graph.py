"""The tiny agent the server tests serve (copied with langgraph.json into a tmp project).

A deterministic stand-in for a model: a human message ``"tool <seconds> <text>"`` makes
the agent call the ``slow`` tool (which sleeps that long, so a test can kill the server
in the middle of it), ``"ask <text>"`` makes it wait on ``interrupt()`` for an answer,
anything else gets a plain reply. The tool raises on the text ``boom``. Every tool call the agent makes is answered by the
``tools`` node, so a thread with an unanswered tool call was left by a run that stopped.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def agent(state: State) -> dict[str, list[AnyMessage]]:
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(f"done: {last.content}")]}
    text = str(last.content) if isinstance(last, HumanMessage) else ""
    if text.startswith("tool "):
        _, seconds, rest = text.split(" ", 2)
        call = {"name": "slow", "args": {"seconds": float(seconds), "text": rest},
                "id": f"call_{uuid.uuid4().hex[:12]}"}  # fmt: skip
        return {"messages": [AIMessage("", tool_calls=[call])]}
    if text.startswith("ask "):
        answer = interrupt({"question": text[4:]})
        return {"messages": [AIMessage(f"answered: {answer}")]}
    return {"messages": [AIMessage(f"echo: {text}")]}


async def tools(state: State) -> dict[str, list[AnyMessage]]:
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    out: list[AnyMessage] = []
    for call in last.tool_calls:
        await asyncio.sleep(call["args"]["seconds"])
        if call["args"]["text"] == "boom":
            raise RuntimeError("the tool failed")
        out.append(ToolMessage(f"slow({call['args']['text']})", tool_call_id=call["id"]))
    return {"messages": out}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


builder = StateGraph(State)
builder.add_node("agent", agent)
builder.add_node("tools", tools)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["tools", END])
builder.add_edge("tools", "agent")
graph = builder.compile()
