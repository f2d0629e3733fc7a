"""The Temporal, Celery and retry-loop glue, in the SDKs' own harnesses (Temporal's
ActivityEnvironment, Celery's eager ``apply``) against a real Postgres."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, TypedDict

import pytest
from celery import Celery
from celery.exceptions import Retry
from langchain_core.messages import HumanMessage
from langgraph.graph import START, StateGraph
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment
from tests.orchestrators import _agent

from langgraph_deterministic import DeterministicSaver, errors, run_config
from langgraph_deterministic.celery import (
    WorkerLocal,
    retry_countdown,
    run_graph_task,
    worker_saver,
)
from langgraph_deterministic.retry import (
    EXIT_PERMANENT,
    EXIT_TRANSIENT,
    acall_with_retries,
    backoff,
    call_with_retries,
    exit_code,
)
from langgraph_deterministic.temporal import (
    activity_run_id,
    run_graph,
    run_graph_sync,
    temporal_errors,
)

ERRORS = [
    cls for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, errors.DeterministicError)
]  # fmt: skip


def env(heartbeat: float | None = None, workflow_id: str = "wf-1") -> ActivityEnvironment:
    e = ActivityEnvironment()
    e.info = dataclasses.replace(
        e.info, workflow_id=workflow_id,
        heartbeat_timeout=None if heartbeat is None else timedelta(seconds=heartbeat),
    )  # fmt: skip
    return e


class Slow(TypedDict, total=False):
    n: int


def slow_graph(saver: DeterministicSaver, seconds: float, entered: threading.Event | None = None,
               release: threading.Event | None = None) -> Any:  # fmt: skip
    def step(state: Slow) -> Slow:
        if entered is not None:
            entered.set()
        if release is not None:
            release.wait(30)
        time.sleep(seconds)
        return {"n": state.get("n", 0) + 1}

    return StateGraph(Slow).add_node("step", step).add_edge(START, "step").compile(
        checkpointer=saver
    )


# ------------------------------------------------------------------------ Temporal


def test_run_id_is_workflow_id_and_step() -> None:
    assert env(workflow_id="chat-42").run(activity_run_id, "turn-3") == "chat-42:turn-3"
    for bad in ("", "  "):
        with pytest.raises(errors.ConfigurationError, match=r"Not the activity.s name"):
            env().run(activity_run_id, bad)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_our_errors_map_to_application_errors(cls: type[errors.DeterministicError]) -> None:
    with pytest.raises(ApplicationError) as caught, temporal_errors():
        raise cls("what happened; the fix")
    assert caught.value.type == cls.__name__
    assert caught.value.message == "what happened; the fix"
    assert caught.value.non_retryable is (not errors.is_retryable(cls("x")))
    assert isinstance(caught.value.__cause__, cls)


def test_other_errors_pass_through() -> None:
    with pytest.raises(TimeoutError), temporal_errors():
        raise TimeoutError("left to the activity's retry policy")


def test_a_lease_shorter_than_the_heartbeat_timeout_is_refused() -> None:
    saver = DeterministicSaver("postgresql://nobody@127.0.0.1:1/none", lease_ttl=3)
    graph = _agent.build(saver)
    with pytest.raises(ApplicationError, match=r"lease_ttl \(3 s\).*heartbeat timeout \(10 s\)") as c:
        asyncio.run(env(heartbeat=10).run(run_graph, graph, _agent.ask("x"), thread_id="t",
                                          step="turn-1"))  # fmt: skip
    assert c.value.non_retryable and c.value.type == "ConfigurationError"
    with pytest.raises(ApplicationError, match="durability='sync'"):
        env(heartbeat=2).run(run_graph_sync, graph, _agent.ask("x"), thread_id="t",
                             step="turn-1", durability="async")  # fmt: skip


def test_async_activity_heartbeats_while_the_graph_runs(db: str) -> None:
    beats: list[float] = []
    e = env(heartbeat=0.2, workflow_id=f"wf-{uuid.uuid4().hex[:6]}")
    e.on_heartbeat = lambda *details: beats.append(time.monotonic())

    async def go() -> Any:
        async with DeterministicSaver(db, lease_ttl=1) as saver:
            out = await e.run(run_graph, slow_graph(saver, 0.5), {"n": 1}, thread_id=e.info.workflow_id,
                              step="turn-1")  # fmt: skip
            run = await saver.aget_run(e.info.workflow_id, f"{e.info.workflow_id}:turn-1")
            return out, run

    out, run = asyncio.run(go())
    assert out == {"n": 2} and run is not None and run.status == "done"
    assert len(beats) >= 4, beats  # every heartbeat_timeout / 4 = 0.05 s over 0.5 s


def test_sync_activity_heartbeats_from_a_thread(db: str) -> None:
    beats: list[float] = []
    e = env(heartbeat=0.2, workflow_id=f"wf-{uuid.uuid4().hex[:6]}")
    e.on_heartbeat = lambda *details: beats.append(time.monotonic())
    with DeterministicSaver(db, lease_ttl=1) as saver:
        out = e.run(run_graph_sync, slow_graph(saver, 0.5), {"n": 1},
                    thread_id=e.info.workflow_id, step="turn-1")  # fmt: skip
    assert out == {"n": 2} and len(beats) >= 4, beats


def test_a_cancelled_attempt_leaves_the_run_to_its_retry(db: str) -> None:
    """The SDK cancels an attempt (a zombie's heartbeat found it gone): CancelledError
    ends it; the retry of the same step finishes the run, and the next turn runs."""
    wf = f"wf-{uuid.uuid4().hex[:6]}"
    entered, release = threading.Event(), threading.Event()

    async def go() -> None:
        async with DeterministicSaver(db, lease_ttl=1) as saver:
            first = env(heartbeat=0.4, workflow_id=wf)
            task = asyncio.ensure_future(first.run(
                run_graph, slow_graph(saver, 0, entered, release), {"n": 1}, thread_id=wf,
                step="turn-1"))  # fmt: skip
            await asyncio.to_thread(entered.wait, 10)
            first.cancel()
            with pytest.raises((CancelledError, asyncio.CancelledError)):
                await task
            release.set()
            again = await env(heartbeat=0.4, workflow_id=wf).run(
                run_graph, slow_graph(saver, 0), {"n": 1}, thread_id=wf, step="turn-1")
            assert again == {"n": 2}
            nxt = await env(heartbeat=0.4, workflow_id=wf).run(
                run_graph, slow_graph(saver, 0), {"n": 5}, thread_id=wf, step="turn-2")
            assert nxt == {"n": 6}

    asyncio.run(go())


def _http_503() -> Exception:
    import httpx

    request = httpx.Request("POST", "https://payments.example/refunds")
    return httpx.HTTPStatusError("503", request=request, response=httpx.Response(503, request=request))


@pytest.mark.parametrize(
    "transient",
    [
        pytest.param(lambda: TimeoutError("read timed out"), id="TimeoutError"),
        pytest.param(lambda: ConnectionResetError("reset by peer"), id="ConnectionResetError"),
        pytest.param(_http_503, id="HTTP-503"),
    ],
)  # fmt: skip
def test_a_transient_error_inside_a_durable_op_is_retried_not_replayed(
    db: str, transient: Any
) -> None:
    from langgraph_deterministic.runner import durable_sync, idempotency_key

    executions: list[str] = []

    def refund(n: int) -> int:
        executions.append(idempotency_key())
        if len(executions) == 1:
            raise transient()  # after the side effect: the provider timed out on the answer
        return n * 10

    def step(state: Slow) -> Slow:
        return {"n": durable_sync("refund", refund, state["n"])}

    wf = f"wf-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(db, lease_ttl=2) as saver:
        graph = StateGraph(Slow).add_node("step", step).add_edge(START, "step")
        compiled = graph.compile(checkpointer=saver)
        call = (run_graph_sync, compiled, {"n": 4})
        with pytest.raises(type(transient())):  # left to the activity's retry policy
            env(heartbeat=2, workflow_id=wf).run(*call, thread_id=wf, step="turn-1", journal=True)
        out = env(heartbeat=2, workflow_id=wf).run(*call, thread_id=wf, step="turn-1",
                                                   journal=True)  # fmt: skip
    assert out == {"n": 40}
    assert len(executions) == 2 and executions[0] == executions[1]  # one idempotency key


# ------------------------------------------------------------------------ Celery


def test_worker_local_builds_one_object_per_process() -> None:
    closed: list[int] = []

    class Thing:
        def __init__(self) -> None:
            self.pid = os.getpid()

        def close(self) -> None:
            closed.append(self.pid)

    local = WorkerLocal(Thing)
    parent = local.get()
    assert local.get() is parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new object; the parent's is neither used nor closed
        try:
            child = local.get()
            ok = child is not parent and child.pid == os.getpid() and local.get() is child
            local.close()
            ok = ok and closed == [os.getpid()]
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert closed == [] and local.get() is parent
    local.close()
    assert closed == [os.getpid()]


def test_worker_saver_wants_a_dsn() -> None:
    with pytest.raises(errors.ConfigurationError, match="before the fork"):
        worker_saver(object())  # type: ignore[arg-type]


def test_retry_countdown_backs_off() -> None:
    assert [retry_countdown(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert retry_countdown(50) == 30.0


@pytest.fixture(scope="module")
def eager_app() -> Celery:
    app = Celery("lgd_glue_tests")
    app.conf.update(task_always_eager=True, task_store_eager_result=False)
    return app


def test_celery_task_permanent_error_fails_once_transient_retries(db: str, eager_app: Celery) -> None:
    attempts: list[int] = []
    with DeterministicSaver(db) as saver:
        graph = slow_graph(saver, 0)

        @eager_app.task(bind=True, max_retries=3, name="mismatch_turn")
        def turn(self: Any, thread: str, n: int, run_id: str | None = None) -> Any:
            attempts.append(self.request.retries)
            return run_graph_task(self, graph, {"n": n}, thread_id=thread, run_id=run_id,
                                  countdown=lambda retries: 0)  # fmt: skip

        thread = f"t-{uuid.uuid4().hex[:6]}"
        assert turn.apply(args=(thread, 1), task_id="task-1").get() == {"n": 2}
        # the same task id with another input: a producer bug; one attempt, our error
        result = turn.apply(args=(thread, 7), task_id="task-1")
        assert isinstance(result.result, errors.RunInputMismatchError)
        assert attempts == [0, 0]


def test_celery_task_waits_for_a_busy_thread(db: str, eager_app: Celery) -> None:
    """ThreadBusyError is retried (eagerly here: at once) until the thread is free."""
    attempts: list[int] = []
    with DeterministicSaver(db) as saver:
        entered, release = threading.Event(), threading.Event()
        thread = f"t-{uuid.uuid4().hex[:6]}"
        holder = threading.Thread(
            target=slow_graph(saver, 0, entered, release).invoke,
            args=({"n": 1}, run_config(thread, "other-run")),
        )
        holder.start()
        entered.wait(10)

        def countdown(retries: int) -> float:
            if retries >= 2:
                release.set()
                holder.join()
            return 0

        @eager_app.task(bind=True, max_retries=5, name="busy_turn")
        def turn(self: Any, n: int) -> Any:
            attempts.append(self.request.retries)
            return run_graph_task(self, slow_graph(saver, 0), {"n": n}, thread_id=thread,
                                  countdown=countdown)  # fmt: skip

        for retries in range(6):  # a broker in miniature: a Retry is delivered again
            result = turn.apply(args=(10,), task_id=f"busy-{thread}", retries=retries)
            if not isinstance(result.result, Retry):
                break
            assert isinstance(result.result.exc, errors.ThreadBusyError), result.result.exc
        assert attempts == [0, 1, 2, 3] and result.result == {"n": 11}
        state = slow_graph(saver, 0).get_state({"configurable": {"thread_id": thread}})
        assert state.values == {"n": 11}


# ------------------------------------------------------------------------ plain loops


def test_call_with_retries_retries_only_transient_errors() -> None:
    calls: list[int] = []
    slept: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise errors.ThreadBusyError("busy")
        return "done"

    assert call_with_retries(flaky, sleep=slept.append) == "done"
    assert slept == [backoff(1), backoff(2)] == [0.5, 1.0]

    def permanent() -> None:
        calls.append(1)
        raise errors.RunInputMismatchError("another input")

    calls.clear()
    with pytest.raises(errors.RunInputMismatchError):
        call_with_retries(permanent, sleep=slept.append)
    assert len(calls) == 1

    async def always_busy() -> None:
        calls.append(1)
        raise errors.ConcurrentRunError("fenced")

    calls.clear()
    with pytest.raises(errors.ConcurrentRunError):
        asyncio.run(acall_with_retries(always_busy, attempts=3, delay=lambda n: 0))
    assert len(calls) == 3


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_exit_codes(cls: type[errors.DeterministicError]) -> None:
    expected = EXIT_TRANSIENT if cls.retryable else EXIT_PERMANENT
    assert exit_code(cls("x")) == expected
    assert exit_code(None) == 0 and exit_code(KeyError("x")) == EXIT_PERMANENT


def test_human_message_input_is_fine() -> None:
    assert _agent.strict_model([HumanMessage(content="a")]).tool_calls
