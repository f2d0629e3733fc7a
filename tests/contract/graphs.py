"""Real graphs for the retry-contract tests, plus side-effect bookkeeping in Postgres so
that several OS processes can be checked together.

Every node records ``start:<name>`` when it begins and ``done:<name>`` just before it
returns, in table ``effects`` (its own connection, autocommit: the record survives a
SIGKILL of the process). A node can be told to *pause* (env ``LGD_PAUSE_AT=<node>``):
it records ``paused:<name>`` and waits until the file ``$LGD_RELEASE`` exists, which lets
a test kill or race a process exactly mid-node without sleeping for a guessed time.
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send, interrupt

EFFECTS_DDL = """CREATE TABLE IF NOT EXISTS effects (
    seq BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, what TEXT NOT NULL, pid INT NOT NULL)"""


def record(dsn: str, thread_id: str, what: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        conn.execute(
            "INSERT INTO effects (thread_id, what, pid) VALUES (%s, %s, %s)",
            (thread_id, what, os.getpid()),
        )


def effects(dsn: str, thread_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        rows = conn.execute(
            "SELECT what FROM effects WHERE thread_id = %s ORDER BY seq", (thread_id,)
        ).fetchall()
    return [r[0] for r in rows]


def wait_for_effect(
    dsn: str,
    thread_id: str,
    what: str,
    count: int = 1,
    procs: Sequence[Any] = (),
    timeout: float = 90,
) -> None:
    """Wait until ``what`` was recorded ``count`` times; fail early if a process died."""
    deadline = time.monotonic() + timeout
    while effects(dsn, thread_id).count(what) < count:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"worker exited with {proc.returncode} before {what!r}: {proc.stderr.read()}"
                )
        if time.monotonic() > deadline:
            raise AssertionError(f"{what!r} x{count} never recorded on {thread_id}")
        time.sleep(0.05)


def _maybe_pause(dsn: str, thread_id: str, name: str) -> None:
    if os.environ.get("LGD_PAUSE_AT") != name:
        return
    record(dsn, thread_id, f"paused:{name}")
    release = Path(os.environ["LGD_RELEASE"])
    while not release.exists():
        time.sleep(0.02)


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    steps: Annotated[list[str], operator.add]


class SubState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    steps: Annotated[list[str], operator.add]


def build_pipeline(dsn: str, *, crash_at: set[str] | None = None) -> StateGraph[Any]:
    """plan -> research (subgraph: gather -> digest) -> 3-way Send fan-out -> write.

    ``crash_at``: node names that raise ``RuntimeError("pod killed")`` the first time they
    run in this process (an in-process stand-in for a crash; SIGKILL tests use pauses).
    """
    crash_at = set(crash_at or ())

    def node(name: str, update: Any) -> Any:
        def run(state: Any, config: RunnableConfig) -> Any:
            thread_id = config["configurable"]["thread_id"]
            record(dsn, thread_id, f"start:{name}")
            _maybe_pause(dsn, thread_id, name)
            if name in crash_at:
                crash_at.discard(name)
                raise RuntimeError(f"pod killed in {name}")
            out = update(state) if callable(update) else update
            record(dsn, thread_id, f"done:{name}")
            return out

        return run

    sub = StateGraph(SubState)
    sub.add_node("gather", node("gather", {"steps": ["gather"]}))
    sub.add_node("digest", node("digest", {"steps": ["digest"]}))
    sub.add_edge(START, "gather")
    sub.add_edge("gather", "digest")
    sub.add_edge("digest", END)

    graph = StateGraph(State)
    graph.add_node("plan", node("plan", {"steps": ["plan"]}))
    graph.add_node("research", sub.compile())
    graph.add_node(
        "section",
        node("section", lambda s: {"steps": [f"section:{s['part']}"]}),  # type: ignore[index]
    )
    graph.add_node(
        "write",
        node(
            "write",
            lambda s: {
                "messages": [AIMessage(content=f"report of {len(s['steps'])} steps")],
                "steps": ["write"],
            },
        ),
    )
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "research")
    graph.add_conditional_edges(
        "research", lambda s: [Send("section", {"part": p}) for p in ("a", "b", "c")], ["section"]
    )
    graph.add_edge("section", "write")
    graph.add_edge("write", END)
    return graph


def build_approval(dsn: str) -> StateGraph[Any]:
    """draft -> approve (interrupt) -> send -> confirm (interrupt) -> END."""

    def draft(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(dsn, config["configurable"]["thread_id"], "done:draft")
        return {"steps": ["draft"]}

    def approve(state: State, config: RunnableConfig) -> dict[str, Any]:
        answer = interrupt("approve the draft?")
        record(dsn, config["configurable"]["thread_id"], f"done:approve:{answer}")
        return {"steps": [f"approve:{answer}"]}

    def send(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(dsn, config["configurable"]["thread_id"], "done:send")
        return {"steps": ["send"]}

    def confirm(state: State, config: RunnableConfig) -> dict[str, Any]:
        answer = interrupt("confirm delivery?")
        record(dsn, config["configurable"]["thread_id"], f"done:confirm:{answer}")
        return {"steps": [f"confirm:{answer}"]}

    graph = StateGraph(State)
    for name, fn in (("draft", draft), ("approve", approve), ("send", send), ("confirm", confirm)):
        graph.add_node(name, fn)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "approve")
    graph.add_edge("approve", "send")
    graph.add_edge("send", "confirm")
    graph.add_edge("confirm", END)
    return graph


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text)]}


def build_chat(dsn: str) -> StateGraph[Any]:
    """One node that answers the last human message (pausable: ``LGD_PAUSE_AT=reply``;
    ``LGD_SLEEP`` seconds of work), for many short runs on one thread."""

    def reply(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        record(dsn, thread_id, "start:reply")
        _maybe_pause(dsn, thread_id, "reply")
        time.sleep(float(os.environ.get("LGD_SLEEP", "0")))
        last = [m for m in state["messages"] if m.type == "human"][-1]
        record(dsn, thread_id, f"done:reply:{last.content}")
        return {"messages": [AIMessage(content=f"re: {last.content}")]}

    graph = StateGraph(State)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    return graph


class ProviderError(RuntimeError):
    """What a model provider answers to a conversation with an unanswered tool call."""


def strict_model(messages: Sequence[AnyMessage]) -> AIMessage:
    """A fake chat model that validates the conversation as Anthropic's API does: every
    tool call must be answered by a ToolMessage before the next non-tool message."""
    open_calls: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            open_calls.discard(m.tool_call_id)
        elif open_calls:
            raise ProviderError(f"400: tool_use ids {sorted(open_calls)} without tool_result")
        if isinstance(m, AIMessage):
            open_calls |= {str(c["id"]) for c in m.tool_calls}
    if open_calls:
        raise ProviderError(f"400: tool_use ids {sorted(open_calls)} without tool_result")
    last = messages[-1]
    if isinstance(last, HumanMessage):
        n = sum(isinstance(m, HumanMessage) for m in messages)
        return AIMessage(
            content="",
            tool_calls=[{"name": "lookup", "args": {"q": last.content}, "id": f"call-{n}"}],
        )
    return AIMessage(content=f"answer: {last.content}")


def build_agent(dsn: str) -> StateGraph[Any]:
    """model -> tools -> model, a ReAct loop with :func:`strict_model`; the tool step is
    pausable (``LGD_PAUSE_AT=tools``) so a test can SIGKILL a worker inside it."""

    def model(state: State, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [strict_model(state["messages"])]}

    def tools(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        record(dsn, thread_id, f"start:tool:{call['id']}")
        _maybe_pause(dsn, thread_id, "tools")
        record(dsn, thread_id, f"done:tool:{call['id']}")
        return {
            "messages": [ToolMessage(content=f"found {call['args']['q']}", tool_call_id=call["id"])]
        }

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph
