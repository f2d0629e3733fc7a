"""The agent the orchestrator trials run, and their bookkeeping in Postgres.

A ReAct loop (model -> tools -> model) with a strict fake model that raises like a
provider's 400 when an AIMessage's tool call has no ToolMessage before the next message.
The tool refunds an order: its side effect is a row in ``trial_events``, inside a durable
op when the trial runs with the journal (``LGD_TRIAL_JOURNAL=1``).

Every point the code passes is recorded in ``trial_events`` (own autocommit connection,
so a SIGKILL cannot lose it) with the process id: ``model``, ``tool:before``,
``effect`` (the side effect, with its idempotency key), ``tool:inside`` (after the side
effect, before the op returns), ``tool:after`` (the op returned: journaled), ``model2``
(the model step after the tool step: right after the tool step's checkpoint). A trial arms
a point in ``trial_plan``: the first process to reach it takes the plan and ``hang``s there
(until the driver kills, freezes or releases it) or ``raise``s a ``TimeoutError``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from langgraph_deterministic.runner import durable_sync, idempotency_key

DDL = """
CREATE TABLE IF NOT EXISTS trial_events (
    seq BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, what TEXT NOT NULL,
    detail TEXT, pid INT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS trial_plan (
    thread_id TEXT NOT NULL, point TEXT NOT NULL, action TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'armed', pid INT, PRIMARY KEY (thread_id, point));
CREATE TABLE IF NOT EXISTS trial_outcomes (
    seq BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, run_id TEXT NOT NULL,
    outcome TEXT NOT NULL, module TEXT, message TEXT, pid INT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
"""


def dsn() -> str:
    return os.environ["LGD_TRIAL_DSN"]


def setup_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


def event(thread_id: str, what: str, detail: str | None = None) -> None:
    with psycopg.connect(dsn(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trial_events (thread_id, what, detail, pid) VALUES (%s, %s, %s, %s)",
            (thread_id, what, detail, os.getpid()),
        )


def outcome(thread_id: str, run_id: str, exc: BaseException | None) -> None:
    """What one attempt (activity or task execution) ended with."""
    with psycopg.connect(dsn(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trial_outcomes (thread_id, run_id, outcome, module, message, pid) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (thread_id, run_id, "ok" if exc is None else type(exc).__name__,
             None if exc is None else type(exc).__module__,
             None if exc is None else str(exc)[:500], os.getpid()),
        )


def checkpoint(thread_id: str, point: str, detail: str | None = None) -> None:
    """Record ``point``; carry out the plan armed there, if this process takes it."""
    event(thread_id, point, detail)
    with psycopg.connect(dsn(), autocommit=True) as conn:
        row = conn.execute(
            "UPDATE trial_plan SET state = 'taken', pid = %s WHERE thread_id = %s AND "
            "point = %s AND state = 'armed' RETURNING action",
            (os.getpid(), thread_id, point),
        ).fetchone()
        if row is None:
            return
        if row[0] == "raise":
            raise TimeoutError(f"read timed out at {point} (injected)")
        event(thread_id, f"hang:{point}")
        while True:  # until the driver kills, freezes or releases this process
            state = conn.execute(
                "SELECT state FROM trial_plan WHERE thread_id = %s AND point = %s",
                (thread_id, point),
            ).fetchone()
            if state is None or state[0] == "released":
                return
            time.sleep(0.05)


class ProviderError(RuntimeError):
    """What a model provider answers to a conversation with an unanswered tool call."""


def unanswered(messages: Sequence[AnyMessage]) -> list[str]:
    """Tool call ids without a ToolMessage before the next non-tool message (or the end)."""
    bad: list[str] = []
    open_calls: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            open_calls.discard(m.tool_call_id)
            continue
        bad.extend(sorted(open_calls))
        open_calls = set()
        if isinstance(m, AIMessage):
            open_calls = {str(c["id"]) for c in m.tool_calls}
    return bad + sorted(open_calls)


def strict_model(messages: Sequence[AnyMessage]) -> AIMessage:
    """A fake chat model that validates the conversation as a provider does."""
    bad = unanswered(messages)
    if bad:
        raise ProviderError(f"400: tool_use ids {bad} without tool_result")
    last = messages[-1]
    if isinstance(last, HumanMessage):
        n = sum(isinstance(m, HumanMessage) for m in messages)
        return AIMessage(
            content="",
            tool_calls=[{"name": "refund", "args": {"order": str(last.content)},
                         "id": f"call-{n}", "type": "tool_call"}],
        )
    return AIMessage(content=f"done: {last.content}")


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def refund(thread_id: str, order: str, call_id: str, journaled: bool) -> str:
    checkpoint(thread_id, "tool:before", call_id)
    key = idempotency_key() if journaled else f"nojournal-{call_id}"
    event(thread_id, "effect", f"{call_id} {key}")
    checkpoint(thread_id, "tool:inside", call_id)
    return f"refunded {order}"


def build(checkpointer: Any, *, journaled: bool | None = None) -> Any:
    """The agent, compiled with ``checkpointer``."""
    use_journal = os.environ.get("LGD_TRIAL_JOURNAL") == "1" if journaled is None else journaled

    def model(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):  # right after the tool step's checkpoint
            checkpoint(thread_id, "model2", last.tool_call_id)
        else:
            checkpoint(thread_id, "model")
        return {"messages": [strict_model(state["messages"])]}

    def tools(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        args = (thread_id, call["args"]["order"], call["id"], use_journal)
        if use_journal:
            result = durable_sync(f"refund:{call['id']}", refund, *args)
        else:
            result = refund(*args)
        checkpoint(thread_id, "tool:after", call["id"])
        return {"messages": [ToolMessage(content=result, tool_call_id=call["id"])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text)]}
