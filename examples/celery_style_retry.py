"""Celery-style at-least-once delivery of LangGraph work, made safe by DeterministicSaver.

Run it: ``python examples/celery_style_retry.py`` (uses ``$DATABASE_URL``, else starts an
embedded Postgres). No Celery install needed: the tiny broker below has the semantics of
Celery with ``acks_late=True`` and ``task_reject_on_worker_lost=True``:

* a message is acknowledged only after the task returns; if the worker dies first, the
  broker delivers the *same message* (same task id, same arguments) again;
* with a visibility timeout shorter than a slow task, a second worker can receive the
  message while the first is still working on it.

The task id names the call, so it is the LangGraph run id.

The same on a real Redis broker with ``celery worker`` processes, with
``langgraph_deterministic.celery``: ``examples/celery_agent.py``.
"""

from __future__ import annotations

import operator
import queue
import threading
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.embedded import ensure_database_url
from langgraph_deterministic.errors import ConcurrentRunError

EMAILS_SENT: list[str] = []


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: Annotated[list[str], operator.add]


class WorkerLost(Exception):
    """The worker process died (OOM kill, deploy, spot instance reclaimed)."""


def build_graph(saver: DeterministicSaver, die_after_email: list[bool]) -> Any:
    def draft(state: Chat) -> Chat:
        return {"notes": [f"draft for: {state['messages'][-1].content}"]}

    def send_email(state: Chat) -> Chat:
        EMAILS_SENT.append(state["notes"][-1])
        return {"notes": ["email sent"]}

    def reply(state: Chat) -> Chat:
        if die_after_email and die_after_email.pop():
            raise WorkerLost("worker lost after the email step")
        return {"messages": [AIMessage(content="Done: the customer was emailed.")]}

    graph = StateGraph(Chat)
    graph.add_node("draft", draft)
    graph.add_node("send_email", send_email)
    graph.add_node("reply", reply)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "send_email")
    graph.add_edge("send_email", "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


@dataclass(frozen=True)
class Message:
    task_id: str
    thread_id: str
    text: str


def handle_message(graph: Any, message: Message) -> str:
    """The Celery task body: ``@app.task(bind=True, acks_late=True)`` -> self.request.id."""
    config = run_config(message.thread_id, run_id=message.task_id)
    # durability="sync": a step's checkpoint is stored before the next step starts, so an
    # attempt that lost a race stops before its next step (here: before the email).
    out = graph.invoke(
        {"messages": [HumanMessage(content=message.text)]}, config, durability="sync"
    )
    return str(out["messages"][-1].content)


def main() -> None:
    url, server = ensure_database_url()
    try:
        with DeterministicSaver(url) as saver:
            saver.setup()
            broker: queue.Queue[Message] = queue.Queue()
            thread_id = f"ticket-{uuid.uuid4().hex[:8]}"
            msg = Message(task_id=str(uuid.uuid4()), thread_id=thread_id, text="refund order 7")
            broker.put(msg)

            print("1. The worker dies after sending the email; the broker redelivers.")
            graph = build_graph(saver, die_after_email=[True])
            while not broker.empty():
                delivered = broker.get()
                try:
                    print("  task result:", handle_message(graph, delivered))
                except WorkerLost as exc:
                    print(f"  {exc}: message not acked, redelivered")
                    broker.put(delivered)
            assert len(EMAILS_SENT) == 1, EMAILS_SENT

            print("2. The same message, delivered again much later (a duplicate): a no-op.")
            print("  task result:", handle_message(build_graph(saver, []), msg))
            assert len(EMAILS_SENT) == 1

            print("3. Visibility timeout: two workers get one new message at the same time.")
            second = Message(str(uuid.uuid4()), thread_id, "and close the ticket")
            results: list[str] = []
            gate = threading.Barrier(2)

            def worker() -> None:
                graph = build_graph(saver, [])
                gate.wait()
                try:
                    results.append(handle_message(graph, second))
                except ConcurrentRunError:
                    # Another worker owns this task: ack and move on.
                    results.append("ConcurrentRunError (the other worker owns the task)")

            workers = [threading.Thread(target=worker) for _ in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            for r in results:
                print("  worker:", r)
            # Whatever the interleaving, the thread holds each message once. Usually one
            # worker gets ConcurrentRunError before its email step; if the second worker
            # arrived a whole step later, it resumed the first one's run and both may have
            # been inside the same step at once -- fencing keeps the *state* linear, only a
            # lease (one worker per task) stops a step in flight from running twice.
            state = build_graph(saver, []).get_state({"configurable": {"thread_id": thread_id}})
            humans = [m.content for m in state.values["messages"] if m.type == "human"]
            assert humans == ["refund order 7", "and close the ticket"], humans
            assert any(r.startswith("Done") for r in results), results
            assert 2 <= len(EMAILS_SENT) <= 3, EMAILS_SENT
            print("OK: messages in the thread:", humans, "| emails sent:", len(EMAILS_SENT))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
