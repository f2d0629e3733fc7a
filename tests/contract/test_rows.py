"""One test (or more) per row of the retry contract, in one process, against real Postgres.

Crashes here are exceptions raised inside a node ("pod killed"); SIGKILL and multi-process
races are in test_processes.py.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from tests.contract.graphs import State, ask, build_approval, build_pipeline, effects

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.checkpointer.contract import ATTEMPT_KEY
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DeterministicError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
)

NODES = ("plan", "gather", "digest", "section", "write")


def plain(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def rows(db: str, thread: str) -> tuple[int, int]:
    with psycopg.connect(db) as conn:
        (cps,) = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)
        ).fetchone() or (0,)
        (writes,) = conn.execute(
            "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", (thread,)
        ).fetchone() or (0,)
    return cps, writes


def done(db: str, thread: str) -> Counter[str]:
    return Counter(e for e in effects(db, thread) if e.startswith("done:"))


def crash_then_retry(
    db: str, saver: DeterministicSaver, thread: str, crash: str, durability: Any = "sync"
) -> dict[str, Any]:
    graph = build_pipeline(db, crash_at={crash}).compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="pod killed"):
        graph.invoke(ask("write the report"), run_config(thread, "job"), durability=durability)
    return graph.invoke(ask("write the report"), run_config(thread, "job"), durability=durability)


# --- run_id policy ---------------------------------------------------------------------


def test_require_refuses_a_graph_run_without_run_id_before_anything_runs(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    with pytest.raises(RunIdRequiredError, match="run_config"):
        graph.invoke(ask("hi"), plain("no-run-id"))
    assert effects(db, "no-run-id") == []  # no node ran
    assert rows(db, "no-run-id") == (0, 0)  # nothing written


async def test_require_refuses_without_run_id_async(db: str) -> None:
    async with DeterministicSaver(db) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        with pytest.raises(RunIdRequiredError):
            await graph.ainvoke(ask("hi"), plain("no-run-id-async"))
    assert effects(db, "no-run-id-async") == []
    assert rows(db, "no-run-id-async") == (0, 0)


def test_require_refuses_every_write_without_run_id(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("hi"), run_config("writes", "r1"))
    before = rows(db, "writes")
    with pytest.raises(RunIdRequiredError):
        graph.update_state(plain("writes"), {"steps": ["by hand"]})
    head = saver.get_tuple(plain("writes"))
    assert head is not None
    with pytest.raises(RunIdRequiredError):
        saver.put_writes(head.config, [("steps", ["x"])], "task-1")
    assert rows(db, "writes") == before
    # With a run id, update_state is a run like any other.
    graph.update_state(run_config("writes", "fix-1"), {"steps": ["by hand"]})
    assert rows(db, "writes")[0] == before[0] + 1


def test_a_hand_built_config_is_refused_under_require(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "hand"}, "metadata": {"run_id": "r1"}}
    with pytest.raises(RunIdRequiredError, match="run_config"):
        graph.invoke(ask("hi"), config)
    assert effects(db, "hand") == [] and rows(db, "hand") == (0, 0)


@pytest.mark.parametrize("policy", ["warn", "off"])
def test_warn_and_off_accept_runs_without_run_id(
    db: str, policy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="langgraph_deterministic")
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        for thread in (f"{policy}-1", f"{policy}-1", f"{policy}-2"):
            out = graph.invoke(ask("hi"), plain(thread))
            assert out["messages"][-1].content.startswith("report of")
    warnings = [r for r in caplog.records if "carries no run id" in r.getMessage()]
    if policy == "warn":
        # Once per thread, not once per write: two threads, two warnings.
        assert sorted(w.getMessage().split("thread ")[1][:9] for w in warnings) == [
            "'warn-1' ",
            "'warn-2' ",
        ]
    else:
        assert warnings == []


def test_uuid_run_id_is_the_same_run_as_its_string_form(db: str, saver: DeterministicSaver) -> None:
    run = uuid.uuid4()
    graph = build_pipeline(db, crash_at={"section"}).compile(checkpointer=saver)
    with pytest.raises(RuntimeError):
        graph.invoke(ask("q"), run_config("uuid", run))
    out = graph.invoke(ask("q"), run_config("uuid", str(run)))
    assert done(db, "uuid")["done:plan"] == 1
    assert len([m for m in out["messages"] if m.type == "human"]) == 1
    head = saver.get_tuple(plain("uuid"))
    assert head is not None and head.metadata["run_id"] == str(run)


def test_uuid_in_a_hand_built_config_is_normalised(db: str) -> None:
    """LangGraph compares metadata.run_id with ==, so a UUID never matched its stored
    string: the saver stores the string and hands the UUID back to the same caller."""
    run = uuid.uuid4()
    config: RunnableConfig = {"configurable": {"thread_id": "uuid-hand", "run_id": run}}
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        graph = build_pipeline(db, crash_at={"write"}).compile(checkpointer=saver)
        with pytest.raises(RuntimeError):
            graph.invoke(ask("q"), config)
        out = graph.invoke(ask("q"), config)
    assert len([m for m in out["messages"] if m.type == "human"]) == 1
    assert done(db, "uuid-hand")["done:plan"] == 1


def test_top_level_run_id_alone_is_refused(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "top"}, "run_id": uuid.uuid4()}
    with pytest.raises(RunIdRequiredError, match="tracing id"):
        graph.invoke(ask("q"), config)
    assert rows(db, "top") == (0, 0)
    # Alongside a real run id it is just the tracing id.
    out = graph.invoke(ask("q"), {**run_config("top", "r1"), "run_id": uuid.uuid4()})
    assert out["messages"][-1].content.startswith("report of")


def test_top_level_run_id_alone_is_never_silently_ignored_under_warn(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="langgraph_deterministic")
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": "top-warn"}, "run_id": uuid.uuid4()}
        graph.invoke(ask("q"), config)
    assert any("tracing id" in r.getMessage() for r in caplog.records)


def test_run_config_rejects_bad_arguments() -> None:
    with pytest.raises(RunIdRequiredError):
        run_config("t", "")
    with pytest.raises(RunIdRequiredError):
        run_config("t", 42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        run_config("", "r")
    assert issubclass(RunIdRequiredError, DeterministicError)


# --- retries ---------------------------------------------------------------------------


@pytest.mark.parametrize("crash", NODES)
def test_retry_with_the_heads_run_id_does_not_reapply_input_or_rerun_tasks(
    db: str, saver: DeterministicSaver, crash: str
) -> None:
    thread = f"retry-{crash}"
    out = crash_then_retry(db, saver, thread, crash)
    clean = (
        build_pipeline(db)
        .compile(checkpointer=saver)
        .invoke(ask("write the report"), run_config(f"clean-{crash}", "job"))
    )
    assert [m.content for m in out["messages"]] == [m.content for m in clean["messages"]]
    assert out["steps"] == clean["steps"]
    # No completed task ran twice (durability "sync"), at any level (gather and digest
    # are subgraph nodes).
    assert done(db, thread) == Counter(
        {"done:plan": 1, "done:gather": 1, "done:digest": 1, "done:section": 3, "done:write": 1}
    )
    run = saver.get_run(thread, "job")
    assert run is not None and run.attempts == 2 and run.status == "done"
    assert run.values == saver.get_tuple(plain(thread)).checkpoint["channel_values"]  # type: ignore[union-attr]


async def test_retry_async(db: str) -> None:
    async with DeterministicSaver(db) as saver:
        graph = build_pipeline(db, crash_at={"digest"}).compile(checkpointer=saver)
        with pytest.raises(RuntimeError):
            await graph.ainvoke(ask("q"), run_config("retry-async", "job"))
        out = await graph.ainvoke(ask("q"), run_config("retry-async", "job"))
        assert len([m for m in out["messages"] if m.type == "human"]) == 1
        assert done(db, "retry-async")["done:gather"] == 1
        run = await saver.aget_run("retry-async", "job")
        assert run is not None and run.attempts == 2


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_retry_after_a_crash_with_async_or_exit_durability(
    db: str, saver: DeterministicSaver, durability: str
) -> None:
    """What may re-run is documented: with "exit", the tasks of the superstep that
    crashed that had finished (their writes are kept only in memory); nothing of earlier
    supersteps, and never the input."""
    thread = f"dur-{durability}"
    out = crash_then_retry(db, saver, thread, "section", durability=durability)
    counts = done(db, thread)
    assert len([m for m in out["messages"] if m.type == "human"]) == 1
    assert counts["done:plan"] == counts["done:gather"] == counts["done:digest"] == 1
    assert counts["done:write"] == 1
    if durability == "async":
        assert counts["done:section"] == 3
    else:
        assert 3 <= counts["done:section"] <= 5  # finished siblings of the crashed task re-ran


def test_same_run_id_with_a_different_input_is_refused(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("write the report"), run_config("mismatch", "job"))
    before, ran = rows(db, "mismatch"), effects(db, "mismatch")
    with pytest.raises(RunInputMismatchError, match="different input"):
        graph.invoke(ask("write a poem instead"), run_config("mismatch", "job"))
    assert rows(db, "mismatch") == before and effects(db, "mismatch") == ran
    # The same input is a retry: same answer, nothing new.
    again = graph.invoke(ask("write the report"), run_config("mismatch", "job"))
    assert again == graph.get_state(plain("mismatch")).values
    assert rows(db, "mismatch") == before


def test_late_retry_of_a_finished_run_returns_its_final_state(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    a = graph.invoke(ask("first"), run_config("late", "A"))
    b = graph.invoke(ask("second"), run_config("late", "B"))
    before, ran = rows(db, "late"), effects(db, "late")
    late = graph.invoke(ask("first"), run_config("late", "A"))
    assert late == a != b
    assert rows(db, "late") == before and effects(db, "late") == ran
    assert graph.get_state(plain("late")).values == b  # the thread stays at B
    run_a = saver.get_run("late", "A")
    assert run_a is not None and run_a.status == "done" and run_a.superseded_by == "B"


async def test_late_retry_of_a_finished_run_async(db: str) -> None:
    async with DeterministicSaver(db) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        a = await graph.ainvoke(ask("first"), run_config("late-async", "A"))
        await graph.ainvoke(ask("second"), run_config("late-async", "B"))
        before = rows(db, "late-async")
        assert await graph.ainvoke(ask("first"), run_config("late-async", "A")) == a
        assert rows(db, "late-async") == before


def test_late_retry_of_an_unfinished_run_is_refused(db: str, saver: DeterministicSaver) -> None:
    crashing = build_pipeline(db, crash_at={"section"}).compile(checkpointer=saver)
    with pytest.raises(RuntimeError):
        crashing.invoke(ask("first"), run_config("late-unfinished", "A"))
    graph = build_pipeline(db).compile(checkpointer=saver)
    # By default a new run is refused on top of an unfinished one (test_multitask.py);
    # "interrupt" continues on top of it, as LangGraph itself would.
    with pytest.raises(RunUnfinishedError, match="'A'"):
        graph.invoke(ask("second"), run_config("late-unfinished", "B"))
    graph.invoke(ask("second"), run_config("late-unfinished", "B", multitask_strategy="interrupt"))
    before, ran = rows(db, "late-unfinished"), effects(db, "late-unfinished")
    with pytest.raises(RunSupersededError, match="had not finished"):
        graph.invoke(ask("first"), run_config("late-unfinished", "A"))
    assert rows(db, "late-unfinished") == before and effects(db, "late-unfinished") == ran
    with pytest.raises(RunInputMismatchError):
        graph.invoke(ask("other"), run_config("late-unfinished", "A"))
    run_a = saver.get_run("late-unfinished", "A")
    assert run_a is not None and run_a.status == "superseded"


# --- interrupts and Command(resume=...) --------------------------------------------------


def test_interrupt_then_the_original_call_retried_raises_it_again(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_approval(db).compile(checkpointer=saver)
    first = graph.invoke(ask("draft it"), run_config("int", "R1"))
    head = saver.get_tuple(plain("int"))
    before = rows(db, "int")
    again = graph.invoke(ask("draft it"), run_config("int", "R1"))
    assert again["__interrupt__"] == first["__interrupt__"]
    assert again == first
    assert saver.get_tuple(plain("int")) == head and rows(db, "int") == before
    assert done(db, "int") == Counter({"done:draft": 1})
    assert saver.get_run("int", "R1").status == "interrupted"  # type: ignore[union-attr]


ASYNC_INTERRUPT_TURNS = (("R1", ask("draft it")), ("R2", Command(resume="yes")))


def build_asking(asynchronous: bool) -> StateGraph[Any]:
    """START -> ask (interrupt) -> ask again (interrupt) -> END: an interrupt in the run's
    first superstep, where its writes race the run's first checkpoint writes most."""

    def asker(name: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            return {"steps": [f"{name}:{interrupt(name)}"]}

        async def anode(state: State) -> dict[str, Any]:
            return node(state)

        return anode if asynchronous else node

    graph = StateGraph(State)
    graph.add_node("first", asker("first"))
    graph.add_node("second", asker("second"))
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    return graph


def check_interrupted(saver: DeterministicSaver, thread: str, run: str, out: Any) -> None:
    assert "__interrupt__" in out
    head = saver.get_tuple(plain(thread))
    record = saver.get_run(thread, run)
    assert head is not None and record is not None
    assert (record.status, record.last_checkpoint_id, record.attempts) == (
        "interrupted", head.config["configurable"]["checkpoint_id"], 1
    ), (thread, run)  # fmt: skip
    if run == "R2":
        first = saver.get_run(thread, "R1")
        assert first is not None and first.status == "superseded"


async def test_an_interrupted_run_reads_interrupted_under_async_durability(db: str) -> None:
    """Under durability "async" a run's checkpoint writes run in the background, and its
    interrupt's write can commit before them: the put creating (or, before, updating) the
    ledger row then read ``running`` (about half of such runs, before). The release of the
    call leaves it ``interrupted``, at the interrupted checkpoint, every time."""
    async with DeterministicSaver(db) as saver:
        graph = build_asking(asynchronous=True).compile(checkpointer=saver)
        for i in range(12):
            for run, given in ASYNC_INTERRUPT_TURNS:
                config = run_config(f"async-int-{i}", run)
                out = await graph.ainvoke(given, config, durability="async")
                await asyncio.to_thread(check_interrupted, saver, f"async-int-{i}", run, out)


def test_an_interrupted_run_reads_interrupted_under_async_durability_sync(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_asking(asynchronous=False).compile(checkpointer=saver)
    for i in range(12):
        for run, given in ASYNC_INTERRUPT_TURNS:
            out = graph.invoke(given, run_config(f"async-int-s{i}", run), durability="async")
            check_interrupted(saver, f"async-int-s{i}", run, out)


def test_the_same_command_resume_delivered_twice_never_answers_a_later_interrupt(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_approval(db).compile(checkpointer=saver)
    graph.invoke(ask("draft it"), run_config("dup", "R1"))
    second = graph.invoke(Command(resume="yes"), run_config("dup", "R2"))
    assert second["__interrupt__"][0].value == "confirm delivery?"
    state, before = graph.get_state(plain("dup")), rows(db, "dup")
    with pytest.raises(RunSupersededError, match="already been applied"):
        graph.invoke(Command(resume="yes"), run_config("dup", "R2"))
    assert graph.get_state(plain("dup")) == state and rows(db, "dup") == before
    assert "done:confirm:yes" not in effects(db, "dup")
    # The real answer to the new interrupt, as a new run, still works.
    final = graph.invoke(Command(resume="delivered"), run_config("dup", "R3"))
    assert final["steps"] == ["draft", "approve:yes", "send", "confirm:delivered"]
    assert done(db, "dup") == Counter(
        {"done:draft": 1, "done:approve:yes": 1, "done:send": 1, "done:confirm:delivered": 1}
    )


def test_a_resume_by_interrupt_id_delivered_again_is_a_no_op(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_approval(db).compile(checkpointer=saver)
    first = graph.invoke(ask("draft it"), run_config("dup-id", "R1"))
    answer = Command(resume={first["__interrupt__"][0].id: "yes"})
    second = graph.invoke(answer, run_config("dup-id", "R2"))
    # Redelivered under another run id (the at-least-once queue made a new one): the
    # answer names the first interrupt, so the second one is raised again, unanswered.
    third = graph.invoke(answer, run_config("dup-id", "R2-redelivered"))
    assert third["__interrupt__"] == second["__interrupt__"]
    assert third["steps"] == second["steps"] == ["draft", "approve:yes", "send"]
    assert not any(e.startswith("done:confirm") for e in effects(db, "dup-id"))


async def test_duplicate_command_async(db: str) -> None:
    async with DeterministicSaver(db) as saver:
        graph = build_approval(db).compile(checkpointer=saver)
        await graph.ainvoke(ask("draft it"), run_config("dup-async", "R1"))
        await graph.ainvoke(Command(resume="yes"), run_config("dup-async", "R2"))
        with pytest.raises(RunSupersededError):
            await graph.ainvoke(Command(resume="yes"), run_config("dup-async", "R2"))
    assert "done:confirm:yes" not in effects(db, "dup-async")


# --- fencing inside one process, through the saver API ------------------------------------


def test_a_checkpoint_can_be_continued_only_once(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config("fence", "A"))
    head = saver.get_tuple(plain("fence"))
    assert head is not None and head.parent_config is not None
    parent = saver.get_tuple(head.parent_config)
    assert parent is not None
    # A zombie continuing the parent again (its own next checkpoint) is refused.
    stale_config: RunnableConfig = {
        "configurable": {**parent.config["configurable"], ATTEMPT_KEY: "zombie-attempt"},
        "metadata": {"run_id": "A"},
    }
    zombie_cp = {**parent.checkpoint, "id": f"1fffffff-ffff-6fff-bfff-{uuid.uuid4().hex[:12]}"}
    before = rows(db, "fence")
    with pytest.raises(ConcurrentRunError, match="already been continued"):
        saver.put(stale_config, zombie_cp, {"source": "loop", "step": 99}, {})  # type: ignore[arg-type, typeddict-item]
    with pytest.raises(ConcurrentRunError):
        saver.put_writes(stale_config, [("steps", ["zombie"])], "zombie-task")
    assert rows(db, "fence") == before


# --- metadata ----------------------------------------------------------------------------


def test_secrets_stay_out_of_stored_metadata(db: str, saver: DeterministicSaver) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    config = run_config("secrets", "r1", openai_api_key="sk-live-123", tenant="acme")
    config["metadata"] = {**config["metadata"], "user": "ann", "session_token": "tok"}  # type: ignore[index]
    graph.invoke(ask("q"), config)
    with psycopg.connect(db) as conn:
        stored = [
            r[0]
            for r in conn.execute(
                "SELECT metadata FROM checkpoints WHERE thread_id = 'secrets'"
            ).fetchall()
        ]
    text = repr(stored)
    assert "sk-live-123" not in text and "tok" not in text
    assert all(m["run_id"] == "r1" for m in stored)
    root = [m for m in stored if "input_fingerprint" in m]
    assert root and all(m["user"] == "ann" for m in stored)
    assert not any("tenant" in m for m in stored)
    with DeterministicSaver(db, metadata_keys={"run_id", "tenant"}) as allowing:
        g2 = build_pipeline(db).compile(checkpointer=allowing)
        g2.invoke(ask("q"), run_config("secrets-2", "r1", tenant="acme", api_key="sk"))
        head = allowing.get_tuple(plain("secrets-2"))
    assert head is not None and head.metadata["tenant"] == "acme"  # type: ignore[typeddict-item]
    assert "api_key" not in head.metadata


# --- branching and cost ------------------------------------------------------------------


def test_contract_adds_no_round_trip_to_writes_or_reads(db: str) -> None:
    """The round trips of a graph run, exactly, with the contract on: one per get_tuple
    (the lease is taken in the head read's pipeline), one per put (the guard rides in the
    write's own statement), none for pending writes (they ride in the pipeline and
    transaction of the put that ends their superstep, in the subgraph's namespace too),
    plus one per run: the release when it returns. On a new thread (no attempt token in
    LangGraph's configs yet) as on a continued one. With ``buffer_writes=False`` every
    put_writes is a round trip of its own."""
    from langgraph_deterministic._db import batch as _batch
    from langgraph_deterministic._db.drivers import execute as _execute

    stored: list[int] = []  # statements storing pending writes, per batch

    def counted_saver(buffer_writes: bool) -> tuple[DeterministicSaver, list[str], Counter[str]]:
        batches: list[str] = []
        calls: Counter[str] = Counter()

        class Counted(DeterministicSaver):
            def _run(self, operation: Any) -> Any:
                with psycopg.connect(db, autocommit=True) as conn:

                    def execute(batch: Any) -> Any:
                        sqls = [st.sql for st in batch.statements]
                        writes = sum("INTO checkpoint_writes" in sql for sql in sqls)
                        stored.append(writes)
                        if any("lgd_release_v4" in sql for sql in sqls):
                            kind = "release"
                            # alone in its transaction: no wait for the WAL flush
                            assert writes or "synchronous_commit" in sqls[-1], sqls
                        elif any("lgd_put_checkpoint" in sql for sql in sqls):
                            kind = "put+writes" if writes else "put"
                        elif writes:
                            kind = "writes"
                        else:
                            kind = "read"
                        batches.append(kind)
                        return _execute(conn, batch)

                    return _batch.run(operation, execute)

            def get_tuple(self, config: RunnableConfig) -> Any:
                calls["get_tuple"] += 1
                return super().get_tuple(config)

            def put(self, *args: Any) -> Any:
                calls["put"] += 1
                return super().put(*args)

            def put_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
                sub = bool(config["configurable"].get("checkpoint_ns"))
                calls["put_writes_sub" if sub else "put_writes_root"] += 1
                super().put_writes(config, *args, **kwargs)

        return Counted(db, buffer_writes=buffer_writes), batches, calls

    for buffer_writes in (True, False):
        saver, batches, calls = counted_saver(buffer_writes)
        with saver:
            graph = build_pipeline(db).compile(checkpointer=saver)
            thread = f"cost-{buffer_writes}"
            for n, run_id in enumerate(("A", "B")):  # a new thread, then a continued one
                batches.clear()
                calls.clear()
                stored.clear()
                graph.invoke(ask(f"q{n}"), run_config(thread, run_id), durability="sync")
                assert calls["put"] >= 5 and calls["put_writes_root"] >= 5
                assert calls["put_writes_sub"] >= 2
                assert batches.count("release") == 1 and batches[-1] == "release"
                assert batches.count("read") == calls["get_tuple"]
                # one statement per put_writes call, whichever batch it rides in
                assert sum(stored) == calls["put_writes_root"] + calls["put_writes_sub"]
                if buffer_writes:
                    assert len(batches) == calls["get_tuple"] + calls["put"] + 1, batches
                    assert batches.count("writes") == 0, batches
                    # every put but the two input checkpoints (root, subgraph) carries the
                    # writes of the superstep it ends, unless it overtook them in LangGraph's
                    # thread pool: they ride in the run's next put then (_writebuffer)
                    assert 0 < batches.count("put+writes") <= calls["put"] - 2, batches
                else:
                    assert len(batches) == sum(calls.values()) + 1, batches
                    assert batches.count("writes") == (
                        calls["put_writes_root"] + calls["put_writes_sub"]
                    )


def test_the_lease_costs_two_statements_and_one_round_trip_per_run(db: str) -> None:
    """The thread lease's exact cost: the same graph run with a lease
    (run_config) and without one (a hand-built config with the same run id: no recorder,
    so no lease, policy "warn") differ by exactly one round trip (the release when the call
    returns) and two statements (lgd_admit_v4 in the head read's pipeline, the release);
    every superstep's batches are the same, statement for statement (the renewal rides
    inside lgd_put_checkpoint_v6, the lease check too for the pending writes riding in its
    transaction, inside their INSERT for the others)."""
    from langgraph_deterministic._db import batch as _batch
    from langgraph_deterministic._db.drivers import execute as _execute

    batches: list[list[str]] = []

    class Counted(DeterministicSaver):
        def _run(self, operation: Any) -> Any:
            with psycopg.connect(db, autocommit=True) as conn:

                def execute(batch: Any) -> Any:
                    batches.append(
                        [
                            st.sql.split("(")[0].split()[-1]
                            for st in batch.statements
                            for _ in (st.params if st.many else [None])
                        ]
                    )
                    return _execute(conn, batch)

                return _batch.run(operation, execute)

    def measured(config: RunnableConfig, thread: str) -> list[list[str]]:
        graph.invoke(ask("warm"), run_config(thread, "warm-up"), durability="sync")
        batches.clear()
        graph.invoke(ask("q"), config, durability="sync")
        return list(batches)

    # buffer_writes=0: the write buffer (one commit per superstep) applies to admitted runs
    # only; off, the two runs differ by the lease alone.
    with Counted(db, run_id_policy="warn", buffer_writes=0) as counted:
        graph = build_pipeline(db).compile(checkpointer=counted)
        leased = measured(run_config("lease-cost-1", "B"), "lease-cost-1")
        bare = measured(
            {"configurable": {"thread_id": "lease-cost-2"}, "metadata": {"run_id": "B"}},
            "lease-cost-2",
        )
    assert len(leased) == len(bare) + 1
    assert sum(map(len, leased)) == sum(map(len, bare)) + 2
    assert leased[-1] == ["lgd_release_v4"]  # the one extra round trip, at the end
    assert leased[0] == ["lgd_admit_v4", *bare[0]]  # the admission rides in the head read
    # Every superstep: the same batches (in the fan-out's order of completion).
    assert sorted(leased[1:-1]) == sorted(bare[1:])


def test_a_release_alone_commits_without_waiting_for_the_wal_flush(db: str) -> None:
    """The lease release with nothing riding along turns synchronous_commit off for its
    own transaction only (its loss in a server crash is a lease that expires); with
    pending writes riding along it is durable as any write."""
    from langgraph_deterministic.checkpointer import _admission
    from langgraph_deterministic.checkpointer._ledger import HeldLease

    DeterministicSaver(db).setup()
    held = HeldLease("lazy-release", "r", "a")
    with psycopg.connect(db) as conn:  # not autocommit: a transaction, as the driver's
        (server,) = conn.execute("SHOW synchronous_commit").fetchone() or ("?",)
        conn.rollback()
        for lazy, inside in ((True, "off"), (False, server)):
            (st,) = next(_admission.release_lease(held, "ok", lazy=lazy)).statements
            conn.execute(st.sql, st.params)
            assert conn.execute("SHOW synchronous_commit").fetchone() == (inside,)
            conn.commit()
            assert conn.execute("SHOW synchronous_commit").fetchone() == (server,)
            conn.rollback()


def test_a_checkpoint_id_sorting_before_its_parent_is_refused(
    db: str, saver: DeterministicSaver
) -> None:
    """LangGraph loads the greatest checkpoint id: a writer whose clock is behind would
    store a checkpoint nobody ever loads. It is refused, naming the clock."""
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config("clock", "A"))
    head = saver.get_tuple(plain("clock"))
    assert head is not None
    config: RunnableConfig = {**head.config, "metadata": {"run_id": "A"}}
    behind = {**head.checkpoint, "id": "00000000-0000-6000-8000-000000000000"}
    before = rows(db, "clock")
    with pytest.raises(ConfigurationError, match="clock"):
        saver.put(config, behind, {"source": "loop", "step": 50}, {})  # type: ignore[arg-type, typeddict-item]
    assert rows(db, "clock") == before
