"""Temporal-style retries of a LangGraph agent, made safe by DeterministicSaver.

Run it: ``python examples/temporal_style_retry.py`` (uses ``$DATABASE_URL``, else starts an
embedded Postgres). No Temporal install needed: the tiny ``run_activity`` below has
Temporal's semantics for an activity with a retry policy and a heartbeat timeout:

* the activity function is called again with the *same arguments* after a failure;
* if a worker goes silent (a pod paused, a network partition), Temporal starts the next
  attempt elsewhere while the old one may still be running: a zombie;
* Temporal's own run id changes between workflow runs, so the LangGraph run id is built
  from the workflow id and a step key the workflow passes in the activity's arguments
  (``"turn-1"``): stable across every attempt of one call, new for every turn (the
  activity's name would repeat on every turn).

The same on a real Temporal server, with ``langgraph_deterministic.temporal``:
``examples/temporal_agent.py``.
"""

from __future__ import annotations

import operator
import threading
import uuid
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.embedded import ensure_database_url
from langgraph_deterministic.errors import ConcurrentRunError

CHARGES: list[str] = []  # the side effect we must not repeat: charging a card


class Order(TypedDict, total=False):
    order_id: str
    log: Annotated[list[str], operator.add]


def build_graph(saver: DeterministicSaver, *, crash_in_ship: bool = False,
                pause: threading.Event | None = None) -> Any:  # fmt: skip
    crashed = [False]

    def charge(state: Order) -> Order:
        CHARGES.append(state["order_id"])
        return {"log": [f"charged {state['order_id']}"]}

    def ship(state: Order) -> Order:
        if pause is not None:
            pause.wait()  # a worker gone silent
        if crash_in_ship and not crashed[0]:
            crashed[0] = True
            raise ConnectionResetError("the pod died while shipping")
        return {"log": [f"shipped {state['order_id']}"]}

    graph = StateGraph(Order)
    graph.add_node("charge", charge)
    graph.add_node("ship", ship)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", "ship")
    graph.add_edge("ship", END)
    return graph.compile(checkpointer=saver)


def process_order_activity(
    graph: Any, workflow_id: str, order_id: str, step: str = "turn-1"
) -> dict[str, Any]:
    """The activity: one graph call. Its run id: the workflow id and the step."""
    config = run_config(thread_id=f"order-{order_id}", run_id=f"{workflow_id}:{step}")
    result: dict[str, Any] = graph.invoke({"order_id": order_id}, config, durability="sync")
    return result


def run_activity(fn: Any, *args: Any, maximum_attempts: int = 3) -> Any:
    """Temporal's retry policy in miniature: same arguments, attempt after attempt."""
    for attempt in range(1, maximum_attempts + 1):
        try:
            return fn(*args)
        except ConnectionResetError as exc:
            print(f"  attempt {attempt} failed ({exc}); Temporal retries the activity")
    raise RuntimeError("activity failed for good")


def main() -> None:
    url, server = ensure_database_url()
    try:
        with DeterministicSaver(url) as saver:
            saver.setup()
            suffix = uuid.uuid4().hex[:8]

            print("1. A worker dies mid-activity; the retry resumes, the card is charged once.")
            graph = build_graph(saver, crash_in_ship=True)
            out = run_activity(process_order_activity, graph, f"wf-{suffix}", f"A{suffix}")
            print("  result:", out["log"])
            assert CHARGES.count(f"A{suffix}") == 1 and out["log"][-1].startswith("shipped")

            print("2. A worker goes silent; Temporal starts attempt 2 elsewhere; the zombie wakes.")
            pause = threading.Event()
            zombie_graph = build_graph(saver, pause=pause)
            outcome: list[str] = []

            def zombie() -> None:
                try:
                    process_order_activity(zombie_graph, f"wf2-{suffix}", f"B{suffix}")
                    outcome.append("zombie finished")
                except ConcurrentRunError:
                    outcome.append("zombie refused: ConcurrentRunError")

            worker = threading.Thread(target=zombie)
            worker.start()
            thread = {"configurable": {"thread_id": f"order-B{suffix}"}}
            while not (  # wait until the zombie's charge step is checkpointed
                (head := saver.get_tuple(thread)) and head.checkpoint["channel_values"].get("log")
            ):
                threading.Event().wait(0.01)
            retry = process_order_activity(build_graph(saver), f"wf2-{suffix}", f"B{suffix}")
            print("  attempt 2 result:", retry["log"])
            pause.set()
            worker.join()
            print("  zombie:", outcome[0])
            assert outcome == ["zombie refused: ConcurrentRunError"]
            assert CHARGES.count(f"B{suffix}") == 1
            run = saver.get_run(f"order-B{suffix}", f"wf2-{suffix}:turn-1")
            assert run is not None
            print(f"  ledger: status={run.status} attempts={run.attempts}")

            print("3. The workflow replays the finished activity: same result, nothing re-run.")
            again = process_order_activity(build_graph(saver), f"wf-{suffix}", f"A{suffix}")
            assert again == out and CHARGES.count(f"A{suffix}") == 1
            print("  result:", again["log"])
            print("OK: every order charged exactly once:", CHARGES)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
