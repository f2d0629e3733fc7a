"""Runs on one thread, in one process: the lease in the ledger, the strategies' edge
cases, and the start check on threads stuck before this saver."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row
from tests.contract.graphs import ask, build_agent, build_approval, build_chat

from langgraph_deterministic import (
    ConfigurationError,
    DeterministicError,
    DeterministicSaver,
    RunUnfinishedError,
    ThreadBusyError,
    run_config,
)
from langgraph_deterministic.checkpointer.contract import HeldLease


def lease_row(db: str, thread: str) -> tuple[Any, ...] | None:
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT run_id, attempt, expires_at, ended, outcome FROM lgd_leases WHERE thread_id = %s",
            (thread,),
        ).fetchone()


def test_errors_are_exported_and_derive_from_deterministic_error() -> None:
    assert issubclass(ThreadBusyError, DeterministicError)
    assert issubclass(RunUnfinishedError, DeterministicError)


def test_bad_strategy_or_ttl_is_refused(db: str) -> None:
    with pytest.raises(ConfigurationError, match="multitask_strategy"):
        DeterministicSaver(db, multitask_strategy="queue")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="multitask_strategy"):
        run_config("t", "r", multitask_strategy="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        DeterministicSaver(db, lease_ttl=0)


def test_the_lease_is_released_when_the_call_returns_and_shown_in_the_run(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_chat(db).compile(checkpointer=saver)
    graph.invoke(ask("one"), run_config("lease", "r1"))
    held = lease_row(db, "lease")
    assert held is not None and held[0] == "r1" and held[3] == "ok"
    # Sequential runs never wait for a TTL: the next one is admitted at once.
    graph.invoke(ask("two"), run_config("lease", "r2"))
    record = saver.get_run("lease", "r2")
    assert record is not None and record.lease is not None
    assert record.lease.run_id == "r2" and record.lease.ended == "ok"
    assert record.multitask_strategy == "reject" and record.multitask_outcome == "free"
    assert saver.get_run("lease", "r1").lease is None  # type: ignore[union-attr]


async def test_async_runs_release_too(db: str) -> None:
    async with DeterministicSaver(db) as saver:
        graph = build_chat(db).compile(checkpointer=saver)
        for i in range(3):
            await graph.ainvoke(ask(f"m{i}"), run_config("lease-async", f"r{i}"))
    assert lease_row(db, "lease-async")[3] == "ok"  # type: ignore[index]


def test_a_run_that_raised_is_unfinished_and_its_retry_resumes(
    db: str, saver: DeterministicSaver
) -> None:
    from tests.contract.graphs import build_pipeline

    crashing = build_pipeline(db, crash_at={"section"}).compile(checkpointer=saver)
    with pytest.raises(RuntimeError):
        crashing.invoke(ask("first"), run_config("raised", "A"))
    assert lease_row(db, "raised")[3] == "error"  # type: ignore[index]
    with pytest.raises(RunUnfinishedError, match="raised an exception"):
        crashing.invoke(ask("second"), run_config("raised", "B"))
    out = crashing.invoke(ask("first"), run_config("raised", "A"))  # the retry
    assert out["messages"][-1].content.startswith("report of")
    # Now finished: a new run is admitted as usual.
    crashing.invoke(ask("second"), run_config("raised", "B"))


def test_a_run_that_ended_in_an_interrupt_is_not_unfinished(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_approval(db).compile(checkpointer=saver)
    first = graph.invoke(ask("draft it"), run_config("hitl", "R1"))
    assert "__interrupt__" in first
    # New input on an interrupted thread keeps LangGraph's behaviour: accepted.
    out = graph.invoke(ask("start over"), run_config("hitl", "R2"))
    assert "__interrupt__" in out


def test_busy_thread_refused_before_anything_is_written(db: str, saver: DeterministicSaver) -> None:
    graph = build_chat(db).compile(checkpointer=saver)
    graph.invoke(ask("one"), run_config("busy", "r1"))
    # Another process holds the thread (a lease taken by hand, as lgd_admit_v3 would).
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgd_leases SET run_id = 'other', attempt = 'x', ended = NULL, "
            "expires_at = now() + interval '1 hour' WHERE thread_id = 'busy'"
        )
        before = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = 'busy'"
        ).fetchone()
    with pytest.raises(ThreadBusyError, match="'other'"):
        graph.invoke(ask("two"), run_config("busy", "r2"))
    with DeterministicSaver(db, multitask_strategy="enqueue", enqueue_timeout=0.3) as waiting:
        g2 = build_chat(db).compile(checkpointer=waiting)
        with pytest.raises(ThreadBusyError, match="waited"):
            g2.invoke(ask("two"), run_config("busy", "r2"))
    with psycopg.connect(db) as conn:
        assert (
            conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 'busy'").fetchone()
            == before
        )
        assert conn.execute(
            "SELECT count(*) FROM lgd_queue WHERE thread_id = 'busy'"
        ).fetchone() == (0,)
    assert lease_row(db, "busy")[:2] == ("other", "x")  # type: ignore[index]
    # interrupt takes the thread over; the fenced holder's writes are refused from now on.
    out = graph.invoke(ask("two"), run_config("busy", "r3", multitask_strategy="interrupt"))
    assert out["messages"][-1].content == "re: two"
    assert saver.get_run("busy", "r3").multitask_outcome == "interrupted other"  # type: ignore[union-attr]


def test_an_enqueued_run_starts_when_the_holder_returns(db: str, saver: DeterministicSaver) -> None:
    graph = build_chat(db).compile(checkpointer=saver)
    graph.invoke(ask("one"), run_config("queue", "r1"))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgd_leases SET run_id = 'other', attempt = 'x', ended = NULL, "
            "expires_at = now() + interval '1 hour' WHERE thread_id = 'queue'"
        )
    done: list[Any] = []
    waiter = threading.Thread(
        target=lambda: done.append(
            graph.invoke(ask("two"), run_config("queue", "r2", multitask_strategy="enqueue"))
        )
    )
    waiter.start()
    with psycopg.connect(db) as conn:  # wait until it queued (its ticket is the proof)
        while conn.execute(
            "SELECT count(*) FROM lgd_queue WHERE thread_id = 'queue'"
        ).fetchone() == (0,):
            conn.commit()
    # The holder returns: its release wakes the waiter (NOTIFY).
    from langgraph_deterministic.checkpointer import _admission

    saver._run(_admission.release_lease(HeldLease("queue", "other", "x"), "ok"))
    waiter.join(timeout=60)
    assert done and done[0]["messages"][-1].content == "re: two"
    assert saver.get_run("queue", "r2").multitask_outcome == "enqueued"  # type: ignore[union-attr]


# --- threads stuck before this saver (adopted from PostgresSaver) -------------------------


def stuck_thread(db: str, thread: str) -> None:
    """A PostgresSaver thread whose run died in a tool step: an unanswered tool call."""
    with psycopg.connect(db, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        peer = PostgresSaver(conn)  # type: ignore[arg-type]
        graph = build_agent(db).compile(checkpointer=peer)
        graph.update_state(
            {"configurable": {"thread_id": thread}},
            {
                "messages": [
                    HumanMessage(content="weather?"),
                    AIMessage(
                        content="", tool_calls=[{"name": "lookup", "args": {}, "id": "call-9"}]
                    ),
                ]
            },
            as_node="model",
        )


def test_a_new_input_on_a_stuck_adopted_thread_is_refused_under_require(
    db: str, saver: DeterministicSaver
) -> None:
    stuck_thread(db, "adopted")
    graph = build_agent(db).compile(checkpointer=saver)
    with pytest.raises(RunUnfinishedError, match="audit") as refused:
        graph.invoke(ask("news?"), run_config("adopted", "n1"))
    assert "call-9" in str(refused.value) and "repair" in str(refused.value)
    assert lease_row(db, "adopted") is None  # the admission was undone: nothing written


def test_a_new_input_on_a_stuck_adopted_thread_is_warned_about_under_warn(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="langgraph_deterministic")
    stuck_thread(db, "adopted-warn")
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        graph = build_agent(db).compile(checkpointer=saver)
        with pytest.raises(Exception, match="400"):  # the strict model rejects the thread
            graph.invoke(ask("news?"), run_config("adopted-warn", "n1"))
    assert any("audit" in r.getMessage() and "stuck" in r.getMessage() for r in caplog.records)


def test_the_docs_snippet_runs(db: str) -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "explanation" / "retries-and-idempotency.md").read_text()
    section = doc.split("## Concurrent runs on one thread", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {"dsn": db, "builder": build_chat(db), "inputs": ask("hi")}
    exec(compile(code, "docs-snippet", "exec"), scope)
    assert scope["saver"].get_run("ticket-42", "msg-8") is not None
    scope["saver"].close()


# --- a graph called inside a node of another graph run ------------------------------------


@pytest.mark.parametrize("child_config", ["run_config", "plain"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_graph_run_inside_a_node_leaves_both_threads_free(
    db: str, child_config: str, api: str
) -> None:
    """A node that invokes another graph on a thread of its own: LangChain hands the outer
    call's callbacks (its run_config recorder among them) to the inner call. Each call's
    lease is released when that call returns -- with run_config the inner run takes and
    releases its own; with a plain config it takes none and leaves the outer one's alone --
    so the next runs on both threads are admitted (before: the outer lease was never
    released and the next outer run got ThreadBusyError)."""
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class Count(TypedDict):
        count: int

    tag = f"{child_config}-{api}"
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        child = (
            StateGraph(Count)
            .add_node("n", lambda s: {"count": (s.get("count") or 0) + 1})
            .add_edge(START, "n")
            .compile(checkpointer=saver)
        )
        calls = [0]

        def inner_config() -> Any:
            calls[0] += 1
            if child_config == "plain":
                return {"configurable": {"thread_id": f"inner-{tag}"}}
            return run_config(f"inner-{tag}", f"inner-{calls[0]}")

        def outer_node(state: Count) -> dict[str, int]:
            child.invoke({"count": 0}, inner_config())
            return {"count": 1}

        async def aouter_node(state: Count) -> dict[str, int]:
            await child.ainvoke({"count": 0}, inner_config())
            return {"count": 1}

        node = outer_node if api == "sync" else aouter_node
        outer = (
            StateGraph(Count).add_node("p", node).add_edge(START, "p").compile(checkpointer=saver)
        )
        for n in range(2):
            config = run_config(f"outer-{tag}", f"outer-{n}")
            if api == "sync":
                outer.invoke({"count": 0}, config)
            else:
                import asyncio

                asyncio.run(outer.ainvoke({"count": 0}, config))
            record = saver.get_run(f"outer-{tag}", f"outer-{n}")
            assert record is not None and record.lease is not None
            assert record.lease.ended == "ok"
            if child_config == "run_config":
                inner = saver.get_run(f"inner-{tag}", f"inner-{n + 1}")
                assert inner is not None and inner.lease is not None
                assert inner.lease.ended == "ok"
        inner_history = list(
            child.get_state_history({"configurable": {"thread_id": f"inner-{tag}"}})
        )
        assert (
            len([s for s in inner_history if s.metadata and s.metadata["source"] == "input"]) == 2
        )


def test_a_retry_with_the_same_config_object_is_a_call_anew(db: str) -> None:
    """One run_config object reused for a retry (after the first call raised): the second
    call is recorded and its lease released like the first's."""
    with DeterministicSaver(db) as saver:
        graph = build_chat(db).compile(checkpointer=saver)
        config = run_config("same-config", "r1")
        graph.invoke(ask("hi"), config)
        graph.invoke(ask("hi"), config)  # the same call again: a retry of r1
        record = saver.get_run("same-config", "r1")
        assert record is not None and record.lease is not None and record.lease.ended == "ok"
        graph.invoke(ask("next"), run_config("same-config", "r2"))  # the thread is free
