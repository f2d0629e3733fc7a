"""``langgraph-deterministic demo``: a worker is SIGKILLed mid-tool and the job is retried.

Two deployments run the same support agent on one Postgres:

* langgraph's own PostgresSaver, retried the way most queues retry (same input, no run id);
* DeterministicSaver, retried with the same ``run_config(thread_id, run_id)``.

Each worker is a real OS process; the first attempt is killed with SIGKILL while the
refund tool runs, and a second process retries. The "model" checks the conversation the
way chat-completion providers do (every tool call must be answered before the next user
turn) and answers HTTP 400 otherwise.

    langgraph-deterministic demo             # embedded Postgres unless --dsn / DATABASE_URL
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from psycopg.conninfo import conninfo_to_dict

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.embedded import create_database, drop_database, ensure_database_url
from langgraph_deterministic.errors import DeterministicError

CRASH_FLAG = "LGD_DEMO_CRASH_IN_TOOL"
SCENARIO = (
    "Scenario: a support agent's refund tool is running when its worker process is "
    "SIGKILLed; the queue retries the job twice. Once on langgraph's PostgresSaver, retried "
    "as queues do (same input, no run id), once on DeterministicSaver (same run_config). "
    "Same graph, same Postgres, real processes."
)


class ProviderError(DeterministicError):
    """The demo model's stand-in for what a provider answers to a malformed conversation
    (HTTP 400). Fix: answer every tool call before the next turn (see ``repair``)."""


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _side_effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS demo_refunds (deployment text, order_id text, at timestamptz DEFAULT now())"
        )


def model(messages: list[AnyMessage]) -> AIMessage:
    """A deterministic stand-in for a chat model that validates like a real provider."""
    # As OpenAI and Anthropic do: an AIMessage's tool calls must all be answered by the
    # ToolMessages right after it, before any other message.
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
        return AIMessage(
            content="",
            tool_calls=[{"name": "refund", "args": {"order_id": "A-1001"}, "id": "call-1"}],
        )
    return AIMessage(content=f"Done: {last.content}")


def build(deployment: str) -> StateGraph[Any]:
    @tool
    def refund(order_id: str) -> str:
        """Refund an order (a side effect: it is recorded in demo_refunds)."""
        if os.environ.pop(CRASH_FLAG, None) == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # the pod dies mid-tool
        with psycopg.connect(os.environ["LGD_DEMO_DSN"], autocommit=True) as conn:
            conn.execute(
                "INSERT INTO demo_refunds (deployment, order_id) VALUES (%s, %s)",
                (deployment, order_id),
            )
        return f"refunded {order_id}"

    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model(state["messages"])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([refund]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph


def worker(deployment: str, dsn: str) -> None:
    """One attempt of the job 'answer message 7 of ticket 42', as a queue would run it."""
    job_input = {"messages": [HumanMessage(content="Please refund order A-1001")]}
    if deployment == "deterministic":
        with DeterministicSaver(dsn) as saver:
            app = build(deployment).compile(checkpointer=saver)
            result = app.invoke(
                job_input,
                run_config(f"ticket-42-{deployment}", "ticket-42:msg-7"),
                durability="sync",
            )
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as saver:
            app = build(deployment).compile(checkpointer=saver)
            config: RunnableConfig = {"configurable": {"thread_id": f"ticket-42-{deployment}"}}
            result = app.invoke(job_input, config, durability="sync")
    print(json.dumps({"answer": result["messages"][-1].content}))


def attempt(deployment: str, dsn: str, crash: bool) -> tuple[int, str]:
    env = {**os.environ, "LGD_DEMO_DSN": dsn, CRASH_FLAG: "1" if crash else "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "langgraph_deterministic.demos.support_agent",
            "--worker",
            deployment,
            "--dsn",
            dsn,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode == 0:
        return 0, json.loads(proc.stdout.strip().splitlines()[-1])["answer"]
    errors = [line for line in proc.stderr.splitlines() if "Error" in line]
    return proc.returncode, (errors or [""])[-1].strip()


def report(deployment: str, dsn: str) -> dict[str, Any]:
    if deployment == "deterministic":
        with DeterministicSaver(dsn, run_id_policy="off") as saver:
            state = (
                build(deployment)
                .compile(checkpointer=saver)
                .get_state({"configurable": {"thread_id": f"ticket-42-{deployment}"}})
            )
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as saver:
            state = (
                build(deployment)
                .compile(checkpointer=saver)
                .get_state({"configurable": {"thread_id": f"ticket-42-{deployment}"}})
            )
    messages = state.values.get("messages", [])
    with psycopg.connect(dsn) as conn:
        refunds = conn.execute(
            "SELECT count(*) FROM demo_refunds WHERE deployment = %s", (deployment,)
        ).fetchone()
    return {
        "user messages": sum(isinstance(m, HumanMessage) for m in messages),
        "unanswered tool calls": len(
            {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
            - {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        ),
        "refunds executed": refunds[0] if refunds else 0,
        "thread finished": not state.next,
    }


def run_demo(dsn: str) -> int:
    print(SCENARIO)
    _side_effects_table(dsn)
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    rows = {}
    for deployment in ("postgres-saver", "deterministic"):
        print(f"\n== {deployment} ==")
        code, out = attempt(deployment, dsn, crash=True)
        print(
            f"attempt 1: killed by signal {-code}" if code < 0 else f"attempt 1: exit {code} {out}"
        )
        for n in (2, 3):
            code, out = attempt(deployment, dsn, crash=False)
            print(f"attempt {n} (retry): {'ok ' + out if code == 0 else 'FAILED: ' + out}")
        rows[deployment] = report(deployment, dsn)
    print("\n== what the thread looks like after the retries ==")
    keys = list(next(iter(rows.values())))
    print(f"{'':24}" + "".join(f"{d:>18}" for d in rows))
    for key in keys:
        print(f"{key:24}" + "".join(f"{r[key]!s:>18}" for r in rows.values()))
    ok = rows["deterministic"] == {
        "user messages": 1,
        "unanswered tool calls": 0,
        "refunds executed": 1,
        "thread finished": True,
    }
    print(
        "\nDeterministicSaver: retried twice, one user message, one refund, thread finished."
        if ok
        else "\nUNEXPECTED: DeterministicSaver's thread is not as it should be."
    )
    return 0 if ok else 1


def main(dsn: str | None = None) -> int:
    """Run the demo on ``dsn`` (else $DATABASE_URL, else an embedded Postgres) in a
    scratch database that is dropped afterwards."""
    if dsn:
        url, server = dsn, None
    else:
        url, server = ensure_database_url()
    scratch = create_database(url, prefix="lgd_demo")
    try:
        return run_demo(scratch)
    finally:
        drop_database(url, str(conninfo_to_dict(scratch)["dbname"]))
        if server is not None:
            server.stop()


def _worker_main() -> int:
    parser = argparse.ArgumentParser(description="one attempt of the demo's job")
    parser.add_argument("--worker", choices=["postgres-saver", "deterministic"], required=True)
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args()
    worker(args.worker, args.dsn)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
