"""A whole worker killed mid-turn: the next turn on the thread finishes the dead run
first (Celery's run_graph_task, Temporal's run_graph, retry.invoke_with_retries), and the
late redelivery of the dead run finds it finished. Every fix RunUnfinishedError names,
followed as written, works for the way its run was started.

A dead worker is made by hand, cheaply: turn 1 raises after its tool's side effect, then
its lease is set to what a SIGKILLed worker leaves (``ended`` NULL, expired). The trials
(scripts/orchestrator_trials.py ``--recovery``) SIGKILL real worker processes."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from celery import Celery
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from tests.orchestrators import _agent

from langgraph_deterministic import DeterministicSaver, errors, run_config
from langgraph_deterministic._orchestration import retry_delay
from langgraph_deterministic.celery import run_graph_task
from langgraph_deterministic.retry import ainvoke_with_retries, invoke_with_retries
from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal
from langgraph_deterministic.temporal import run_graph


@pytest.fixture(scope="module")
def trial_db(db: str) -> Iterator[str]:
    """The agent's bookkeeping tables (tests/orchestrators/_agent.py) in the test database."""
    _agent.setup_tables(db)
    before = os.environ.get("LGD_TRIAL_DSN")
    os.environ["LGD_TRIAL_DSN"] = db
    try:
        yield db
    finally:
        if before is None:
            os.environ.pop("LGD_TRIAL_DSN", None)
        else:
            os.environ["LGD_TRIAL_DSN"] = before


def q(db: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []


def dies_at(db: str, thread: str, point: str = "tool:after") -> None:
    """Turn 1 stops at ``point`` (after the refund's side effect, and with the journal its
    op's result stored): it raises there, and ``worker_died`` makes that a death."""
    q(db, "INSERT INTO trial_plan (thread_id, point, action) VALUES (%s, %s, 'raise')",
      thread, point)  # fmt: skip


def worker_died(db: str, thread: str) -> None:
    """The lease as a SIGKILLed worker leaves it: never released, expired."""
    q(db, "UPDATE lgd_leases SET ended = NULL, expires_at = now() - interval '1 second' "
       "WHERE thread_id = %s", thread)  # fmt: skip


def effects(db: str, thread: str) -> list[str]:
    rows = q(db, "SELECT detail FROM trial_events WHERE thread_id = %s AND what = 'effect' "
             "ORDER BY seq", thread)  # fmt: skip
    return [str(r[0]).split(" ")[0] for r in rows]


def humans(saver: DeterministicSaver, thread: str) -> list[str]:
    state = _agent.build(saver, journaled=False).get_state({"configurable": {"thread_id": thread}})
    messages = state.values["messages"]
    assert not _agent.unanswered(messages) and not state.next
    return [str(m.content) for m in messages if m.type == "human"]


def start_turn_one(saver: DeterministicSaver, db: str, thread: str, journal: bool) -> None:
    """Turn 1, run "r1", killed after its tool's side effect."""
    dies_at(db, thread)
    graph = _agent.build(saver, journaled=journal)
    runner = DeterministicRunner(journal=PostgresJournal(saver)) if journal else None
    with pytest.raises(TimeoutError):
        config = run_config(thread, "r1")
        if runner is not None:
            runner.invoke(graph, _agent.ask("a"), config, durability="sync")
        else:
            graph.invoke(_agent.ask("a"), config, durability="sync")
    worker_died(db, thread)


def check_recovered(saver: DeterministicSaver, db: str, thread: str, journal: bool) -> None:
    assert humans(saver, thread) == ["a", "b"]
    # with the journal the refund whose op had returned is not run again
    assert effects(db, thread).count("call-1") == (1 if journal else 2)
    r1 = saver.get_run(thread, "r1")
    assert r1 is not None and r1.status == "done"


JOURNAL = [pytest.param(False, id="graph"), pytest.param(True, id="journal")]


@pytest.mark.parametrize("journal", JOURNAL)
def test_the_retry_loop_finishes_a_dead_run_before_its_own(trial_db: str, journal: bool) -> None:
    thread = f"loop-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(trial_db, lease_ttl=2) as saver:
        start_turn_one(saver, trial_db, thread, journal)
        graph = _agent.build(saver, journaled=journal)
        out = invoke_with_retries(graph, _agent.ask("b"), thread_id=thread, run_id="r2",
                                  journal=journal, sleep=lambda s: None)  # fmt: skip
        assert out["messages"][-1].content == "done: refunded b"
        check_recovered(saver, trial_db, thread, journal)
        # The dead run's late redelivery (its original input): finished, skipped.
        late = invoke_with_retries(graph, _agent.ask("a"), thread_id=thread, run_id="r1",
                                   journal=journal)  # fmt: skip
        assert late["messages"][-1].content == "done: refunded a"
        check_recovered(saver, trial_db, thread, journal)


def test_the_async_retry_loop_finishes_a_dead_run_first(trial_db: str) -> None:
    thread = f"aloop-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(trial_db, lease_ttl=2) as saver:
        start_turn_one(saver, trial_db, thread, False)

    async def go() -> None:
        async with DeterministicSaver(trial_db, lease_ttl=2) as asaver:
            graph = _agent.build(asaver, journaled=False)
            await ainvoke_with_retries(graph, _agent.ask("b"), thread_id=thread, run_id="r2")

    asyncio.run(go())
    with DeterministicSaver(trial_db) as saver:
        check_recovered(saver, trial_db, thread, False)


@pytest.fixture(scope="module")
def eager_app() -> Celery:
    app = Celery("lgd_finish_first_tests")
    app.conf.update(task_always_eager=True, task_store_eager_result=False)
    return app


@pytest.mark.parametrize("journal", JOURNAL)
def test_a_celery_task_finishes_a_dead_run_before_its_own(
    trial_db: str, eager_app: Celery, journal: bool
) -> None:
    thread = f"celery-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(trial_db, lease_ttl=2) as saver:
        start_turn_one(saver, trial_db, thread, journal)
        graph = _agent.build(saver, journaled=journal)

        @eager_app.task(bind=True, max_retries=3, name=f"finish_first_{journal}")
        def turn(self: Any, text: str) -> Any:
            return run_graph_task(self, graph, _agent.ask(text), thread_id=thread,
                                  journal=journal)  # fmt: skip

        assert turn.apply(args=("b",), task_id="r2").get()["messages"][-1].content == (
            "done: refunded b"
        )
        check_recovered(saver, trial_db, thread, journal)
        late = turn.apply(args=("a",), task_id="r1").get()  # the broker's redelivery
        assert late["messages"][-1].content == "done: refunded a"
        check_recovered(saver, trial_db, thread, journal)


def activity_env(workflow_id: str) -> ActivityEnvironment:
    e = ActivityEnvironment()
    e.info = dataclasses.replace(e.info, workflow_id=workflow_id,
                                 heartbeat_timeout=timedelta(seconds=2))  # fmt: skip
    return e


@pytest.mark.parametrize("journal", JOURNAL)
def test_a_temporal_activity_finishes_a_dead_run_before_its_own(
    trial_db: str, journal: bool
) -> None:
    """A turn's workflow that was terminated (or a workflow per message) leaves the
    thread's run unfinished; the next turn's activity finishes it."""
    wf = f"wf-{uuid.uuid4().hex[:6]}"
    dies_at(trial_db, wf)

    async def go() -> Any:
        async with DeterministicSaver(trial_db, lease_ttl=2) as asaver:
            graph = _agent.build(asaver, journaled=journal)
            with pytest.raises(TimeoutError):
                await activity_env(wf).run(run_graph, graph, _agent.ask("a"), thread_id=wf,
                                           step="turn-1", journal=journal)  # fmt: skip
            worker_died(trial_db, wf)
            return await activity_env(wf).run(run_graph, graph, _agent.ask("b"), thread_id=wf,
                                              step="turn-2", journal=journal)  # fmt: skip

    out = asyncio.run(go())
    assert out["messages"][-1].content == "done: refunded b"
    with DeterministicSaver(trial_db) as saver:
        assert humans(saver, wf) == ["a", "b"]
        assert effects(trial_db, wf).count("call-1") == (1 if journal else 2)


def test_a_run_that_raised_is_not_finished_for_you(trial_db: str, eager_app: Celery) -> None:
    """Only a dead worker's run is finished first: one that raised would most likely
    raise again, so the next turn gets RunUnfinishedError, with a fix that works."""
    thread = f"raised-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(trial_db, lease_ttl=2) as saver:
        dies_at(trial_db, thread)
        graph = _agent.build(saver, journaled=False)
        with pytest.raises(TimeoutError):
            graph.invoke(_agent.ask("a"), run_config(thread, "r1"), durability="sync")

        @eager_app.task(bind=True, max_retries=3, name="raised_turn")
        def turn(self: Any, text: str) -> Any:
            return run_graph_task(self, graph, _agent.ask(text), thread_id=thread)

        result = turn.apply(args=("b",), task_id="r2")
        assert isinstance(result.result, errors.RunUnfinishedError)
        assert not result.result.died and result.result.unfinished_run_id == "r1"


def fix_named(exc: errors.RunUnfinishedError) -> str:
    """The call the error names to finish the unfinished run, exactly as printed."""
    message = str(exc)
    start = message.index("finish the unfinished run first: ") + len(
        "finish the unfinished run first: "
    )
    return message[start : message.index(" continues it where it stopped")].split(" (it ran")[0]


@pytest.mark.parametrize("journal", JOURNAL)
@pytest.mark.parametrize("died", [True, False], ids=["died", "raised"])
def test_the_fix_the_error_names_works_for_how_the_run_started(
    trial_db: str, journal: bool, died: bool
) -> None:
    thread = f"fix-{uuid.uuid4().hex[:6]}"
    with DeterministicSaver(trial_db, lease_ttl=2) as saver:
        dies_at(trial_db, thread)
        graph = _agent.build(saver, journaled=journal)
        runner = DeterministicRunner(journal=PostgresJournal(saver)) if journal else None
        with pytest.raises(TimeoutError):
            if runner is not None:
                runner.invoke(graph, _agent.ask("a"), run_config(thread, "r1"), durability="sync")
            else:
                graph.invoke(_agent.ask("a"), run_config(thread, "r1"), durability="sync")
        if died:
            worker_died(trial_db, thread)
        with pytest.raises(errors.RunUnfinishedError) as refused:
            graph.invoke(_agent.ask("b"), run_config(thread, "r2"), durability="sync")
        assert refused.value.journaled is journal and refused.value.died is died
        code = fix_named(refused.value)
        assert code.startswith("DeterministicRunner(" if journal else "graph.invoke(")
        namespace = {"graph": graph, "saver": saver, "run_config": run_config,
                     "DeterministicRunner": DeterministicRunner, "PostgresJournal": PostgresJournal}  # fmt: skip
        finished = eval(code, namespace)  # the fix, as the error prints it
        assert finished["messages"][-1].content == "done: refunded a"
        if runner is not None:
            runner.invoke(graph, _agent.ask("b"), run_config(thread, "r2"), durability="sync")
        else:
            graph.invoke(_agent.ask("b"), run_config(thread, "r2"), durability="sync")
        assert humans(saver, thread) == ["a", "b"]
        assert effects(trial_db, thread).count("call-1") == (1 if journal else 2)


def test_a_busy_threads_retry_waits_no_longer_than_its_lease() -> None:
    busy = errors.ThreadBusyError("busy")
    busy.lease_expires_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert 0.9 < retry_delay(busy, 8) <= 1.06  # backoff(8) would be 30 s
    assert retry_delay(busy, 1) == 0.5  # the backoff when it is shorter
    busy.lease_expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    assert retry_delay(busy, 8) == 0.05  # expired already: at once
    assert retry_delay(errors.ConcurrentRunError("x"), 3) == 2.0


def test_temporal_maps_a_permanent_refusal_to_non_retryable(trial_db: str) -> None:
    """What the workflow's retry policy relies on: our permanent errors arrive as
    non-retryable ApplicationErrors, so they are not retried whatever the policy."""
    wf = f"wf-{uuid.uuid4().hex[:6]}"

    async def go() -> None:
        async with DeterministicSaver(trial_db, lease_ttl=2) as asaver:
            graph = _agent.build(asaver, journaled=False)
            e = activity_env(wf)
            await e.run(run_graph, graph, _agent.ask("a"), thread_id=wf, step="turn-1")
            with pytest.raises(ApplicationError) as failed:
                await e.run(run_graph, graph, _agent.ask("other"), thread_id=wf, step="turn-1")
            assert failed.value.non_retryable and failed.value.type == "RunInputMismatchError"

    asyncio.run(go())
