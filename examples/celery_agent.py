"""A support agent as a Celery task on a real Redis broker, with a prefork worker.

Run it against Redis and Postgres::

    redis-server --port 6379 --save '' &
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 DATABASE_URL=postgresql://... \\
        python examples/celery_agent.py

It starts ``celery -A celery_agent worker --pool prefork`` (this file is the app) and sends
two turns of a chat:

1. In turn 1 the refund tool pays out (a durable op: journaled), then the pool process
   running the task is SIGKILLed (an OOM kill, a spot instance reclaimed). With
   ``acks_late`` and ``task_reject_on_worker_lost`` the broker hands the same message (same
   task id: the same run id) to another process; the graph resumes from its checkpoint and
   the journal hands back the refund's result. One refund, not two.
2. The same message delivered twice at once (a visibility timeout shorter than the task,
   or a producer retry that kept the task id): one delivery runs the turn, the other is
   fenced off, retries, finds the run finished and returns its answer.
3. Turn 3 on the same thread: the thread is neither stuck nor duplicated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from celery import Celery
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.celery import WorkerLocal, run_graph_task, worker_saver
from langgraph_deterministic.runner import durable_sync, idempotency_key

DSN = os.environ["DATABASE_URL"]
BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
LEASE_TTL = 10.0  # seconds a dead worker keeps the thread: well under the visibility timeout

app = Celery("celery_agent", broker=BROKER, backend=BROKER)
app.conf.update(
    task_acks_late=True,  # ack after the task ran: a lost worker's message is redelivered
    task_reject_on_worker_lost=True,  # ... also when the pool process was killed
    worker_prefetch_multiplier=1,  # a busy process does not sit on other messages
    broker_transport_options={  # why each: docs/how-to/celery.md
        "visibility_timeout": 300,  # longer than the longest turn
        "unacked_restore_interval": 5,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 30,
    },
    result_expires=3600,
)

SAVER = worker_saver(DSN, lease_ttl=LEASE_TTL)  # opened in each pool process, after the fork


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def refund(order: str) -> str:
    """The payment provider, deduplicating by idempotency key (a table here)."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS example_refunds (key TEXT, pid INT)")
        conn.execute("INSERT INTO example_refunds VALUES (%s, %s)", (idempotency_key(), os.getpid()))
    return f"refunded {order}"


def model(state: Chat) -> Chat:  # a fake model: asks for a refund, then answers
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"name": "refund", "args": {"order": str(last.content)}, "id": uuid.uuid4().hex}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"Done: {last.content}.")]}


def tools(state: Chat) -> Chat:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    result = durable_sync("refund", refund, call["args"]["order"])
    die_once = Path(os.environ.get("EXAMPLE_DIE_ONCE", "/nonexistent/x"))
    if die_once.parent.exists() and not die_once.exists():
        die_once.touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the pool process dies after the refund
    return {"messages": [ToolMessage(content=result, tool_call_id=call["id"])]}


def route(state: Chat) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def build(saver: DeterministicSaver) -> Any:
    graph = StateGraph(Chat)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


GRAPH = WorkerLocal(lambda: build(SAVER.get()))


@app.task(bind=True, max_retries=20, autoretry_for=(TimeoutError, ConnectionError),
          retry_backoff=True, retry_backoff_max=30)  # fmt: skip
def chat_turn(self: Any, thread_id: str, text: str) -> str:
    out = run_graph_task(self, GRAPH.get(), {"messages": [HumanMessage(content=text)]},
                         thread_id=thread_id, journal=True)  # fmt: skip
    return str(out["messages"][-1].content)


def refunds() -> int:
    """Refunds the provider made: executions with one idempotency key count once."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS example_refunds (key TEXT, pid INT)")
        row = conn.execute("SELECT count(DISTINCT key) FROM example_refunds").fetchone()
        return int(row[0]) if row else 0


def main() -> None:
    with DeterministicSaver(DSN) as saver:
        saver.setup()
    before = refunds()
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "EXAMPLE_DIE_ONCE": f"{tmp}/died",
               "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_agent", "worker", "--pool", "prefork",
             "--concurrency", "2", "--loglevel", "WARNING", "-n", f"example-{uuid.uuid4().hex[:6]}@%h"],
            cwd=here, env=env,
        )  # fmt: skip
        try:
            thread = f"ticket-{uuid.uuid4().hex[:8]}"
            print("1. The pool process dies after the refund; the message is redelivered.")
            answer = chat_turn.delay(thread, "order 17").get(timeout=120)
            print("  answer:", answer)
            assert answer == "Done: refunded order 17.", answer
            assert refunds() - before == 1, "refunded twice"

            print("2. One message delivered twice at once: one delivery runs it.")
            task_id = str(uuid.uuid4())
            for _ in range(2):
                chat_turn.apply_async((thread, "order 18"), task_id=task_id)
            answer = app.AsyncResult(task_id).get(timeout=120)
            print("  answer:", answer)
            assert answer == "Done: refunded order 18.", answer
            assert refunds() - before == 2, "refunded twice"

            print("3. Turn 3 on the same thread.")
            answer = chat_turn.delay(thread, "order 19").get(timeout=120)
            print("  answer:", answer)
            with DeterministicSaver(DSN) as saver:
                state = build(saver).get_state({"configurable": {"thread_id": thread}})
            humans = [m.content for m in state.values["messages"] if m.type == "human"]
            assert humans == ["order 17", "order 18", "order 19"], humans
            assert refunds() - before == 3
            print(f"OK: {len(humans)} turns, each once; one refund per turn")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)


if __name__ == "__main__":
    main()
