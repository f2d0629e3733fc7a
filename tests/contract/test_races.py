"""Races between attempts of one run, and what a refused attempt leaves behind.

* A process whose attempt lost a race keeps serving graph runs (its connections'
  prepared statements survive the refusal), with every ``prepare_threshold``.
* Two attempts of one run started at once: exactly one finishes it, the loser's error
  changes nothing recorded about the run, and the next run succeeds.
* A late retry of a finished run, cancelled or failing at any point, changes nothing: the
  next run is admitted at once.
* Input that cannot be serialised is refused and leaves no row in any table.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.graph import END, START, StateGraph
from psycopg_pool import ConnectionPool

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic._db.batch import Batch, Statement
from langgraph_deterministic._db.drivers import aexecute, execute
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    DeterministicError,
    SerializationError,
)

LGD_TABLES = (
    "checkpoints", "checkpoint_blobs", "checkpoint_writes", "lgd_chain", "lgd_runs",
    "lgd_leases", "lgd_queue", "lgd_journal", "lgd_journal_attempts",
)  # fmt: skip


class S(TypedDict, total=False):
    steps: Annotated[list[str], operator.add]
    item: Any


def build(gate: threading.Barrier | None = None, crash: list[str] | None = None) -> StateGraph[Any]:
    """a -> b -> c; ``gate``: node a of each attempt waits for the other (a race);
    ``crash``: node a raises while the list is not empty (popping it)."""

    def a(state: S) -> dict[str, Any]:
        if crash:
            raise RuntimeError(f"pod killed in a ({crash.pop()})")
        if gate is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(timeout=10)
        return {"steps": ["a"]}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", lambda s: {"steps": ["b"]})
    g.add_node("c", lambda s: {"steps": ["c"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def rows_of(dsn: str, thread_id: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            t: conn.execute(
                f"SELECT count(*) FROM {t} WHERE thread_id = %s", (thread_id,)
            ).fetchone()[0]  # type: ignore[index]
            for t in LGD_TABLES
        }


# -- the root cause, at the driver: a refusal ahead of a statement psycopg prepares ------


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 5])
def test_a_failed_pipeline_leaves_prepared_statements_in_sync(db: str, threshold: int) -> None:
    """The batch that fails carries, after the failing statement, the execution at which
    psycopg prepares the next one (its Parse is skipped by the server): the connection
    must run that statement again afterwards."""
    fail = Statement("SELECT 1 / %(d)s::int", {"d": 0})
    later = Statement("SELECT %(x)s::int + 1", {"x": 1}, fetch=True)
    with psycopg.connect(db, autocommit=True, prepare_threshold=threshold) as conn:
        for _ in range(threshold):
            assert execute(conn, Batch.write(later)) == [[(2,)]]
        with pytest.raises(psycopg.errors.DivisionByZero):
            execute(conn, Batch.write(fail, later))
        for _ in range(threshold + 3):
            assert execute(conn, Batch.write(later)) == [[(2,)]]


async def test_a_failed_pipeline_leaves_prepared_statements_in_sync_async(db: str) -> None:
    fail = Statement("SELECT 1 / %(d)s::int", {"d": 0})
    later = Statement("SELECT %(x)s::int + 2", {"x": 1}, fetch=True)
    conn = await psycopg.AsyncConnection.connect(db, autocommit=True, prepare_threshold=2)
    async with conn:
        for _ in range(2):
            await aexecute(conn, Batch.write(later))
        with pytest.raises(psycopg.errors.DivisionByZero):
            await aexecute(conn, Batch.write(fail, later))
        for _ in range(4):
            assert await aexecute(conn, Batch.write(later)) == [[(3,)]]


# -- a process that lost a race serves its next runs ------------------------------------

_THRESHOLDS = {"default": {}, "0": {"prepare_threshold": 0}, "5": {"prepare_threshold": 5},
               "None": {"prepare_threshold": None}}  # fmt: skip


def _race(saver: DeterministicSaver, thread_id: str, run_id: str) -> list[str]:
    """Two attempts of one run at once; returns each one's outcome ("ok" or the error).

    A first attempt stores the run's input and dies in node a; then two retries resume
    from there together, both run node a, and race to store its checkpoint."""
    gate = threading.Barrier(2)
    graph = build(gate, crash=["first attempt"]).compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="pod killed"):
        graph.invoke({"steps": ["in"]}, run_config(thread_id, run_id), durability="sync")
    outcomes: list[str] = []

    def attempt() -> None:
        try:
            graph.invoke({"steps": ["in"]}, run_config(thread_id, run_id), durability="sync")
            outcomes.append("ok")
        except DeterministicError as exc:
            outcomes.append(type(exc).__name__)

    workers = [threading.Thread(target=attempt) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    return outcomes


@pytest.mark.parametrize("threshold", list(_THRESHOLDS))
def test_a_process_that_lost_a_race_runs_20_more(db: str, threshold: str) -> None:
    # One connection (pool of 1), races one after another: the refusals land at several
    # counts of psycopg's statement executions, one of them where it prepares the put.
    with DeterministicSaver(db, pool_max_size=1, **_THRESHOLDS[threshold]) as saver:
        lost = 0
        for i in range(4):
            outcomes = _race(saver, f"race-{threshold}-{i}", "r1")
            assert sorted(outcomes) in (["ConcurrentRunError", "ok"], ["ok", "ok"]), outcomes
            lost += outcomes.count("ConcurrentRunError")
        assert lost >= 1
        graph = build().compile(checkpointer=saver)
        for n in range(20):
            out = graph.invoke(
                {"steps": [str(n)]}, run_config(f"after-{threshold}-{n % 4}", f"n{n}")
            )
            assert out["steps"][-3:] == ["a", "b", "c"]


def test_the_loser_of_a_race_reports_concurrent_run_error(db: str) -> None:
    with DeterministicSaver(db) as saver:
        outcomes = _race(saver, "loser", "r1")
    assert "ok" in outcomes
    assert set(outcomes) <= {"ok", ConcurrentRunError.__name__}


# -- a finished run stays finished -----------------------------------------------------


def _lease(dsn: str, thread_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT run_id, ended FROM lgd_leases WHERE thread_id = %s", (thread_id,)
        ).fetchone()


async def test_a_cancelled_late_retry_of_a_finished_run_changes_nothing(db: str) -> None:
    """Finish a run, start it again (same run id and input) and cancel that call 0 ms to
    the run's length in; the next run is admitted at once, every time."""
    thread = "late-cancelled"
    async with DeterministicSaver(db, lease_ttl=30) as saver:
        graph = build().compile(checkpointer=saver)
        loop = asyncio.get_running_loop()
        await graph.ainvoke({"steps": ["warm"]}, run_config("late-warm", "w"))
        t0 = loop.time()
        await graph.ainvoke({"steps": ["in0"]}, run_config(thread, "r0"))
        length = loop.time() - t0
        # 0 ms, the first milliseconds (the admission in flight), then on to past the run's
        # length (scripts/contract_trials.py sweeps every 0.5 ms).
        delays = sorted({0.0, 0.0005, 0.001, 0.002} | {length * k / 8 for k in range(1, 11)})
        previous = "r0"
        for i, delay in enumerate(delays, start=1):
            retry = asyncio.ensure_future(
                graph.ainvoke({"steps": [f"in{i - 1}"]}, run_config(thread, previous))
            )
            await asyncio.sleep(delay)
            retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retry
            # The finished run's lease and record are as it left them.
            assert _lease(db, thread) == (previous, "ok"), delay
            record = await saver.aget_run(thread, previous)
            assert record is not None and record.status == "done", delay  # its call returned
            out = await graph.ainvoke({"steps": [f"in{i}"]}, run_config(thread, f"r{i}"))
            assert out["steps"][-4:] == [f"in{i}", "a", "b", "c"], delay
            record = await saver.aget_run(thread, previous)
            assert record is not None and record.status == "done", delay
            previous = f"r{i}"


# -- nothing written on refused input ------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_input_that_cannot_be_serialised_leaves_no_row(db: str, mode: str) -> None:
    thread = f"unserialisable-{mode}"
    async with DeterministicSaver(db) as saver:
        graph = build().compile(checkpointer=saver)
        bad = {"steps": ["in"], "item": threading.Lock()}
        with pytest.raises(SerializationError):
            if mode == "sync":
                await asyncio.to_thread(graph.invoke, bad, run_config(thread, "r1"))
            else:
                await graph.ainvoke(bad, run_config(thread, "r1"))
        assert rows_of(db, thread) == dict.fromkeys(LGD_TABLES, 0)
        # On a thread with history: the lease goes back to what it was.
        await graph.ainvoke({"steps": ["ok"]}, run_config(thread, "r2"))
        before = _lease(db, thread)
        counts = rows_of(db, thread)
        with pytest.raises(SerializationError):
            await graph.ainvoke(bad, run_config(thread, "r3"))
        assert _lease(db, thread) == before and rows_of(db, thread) == counts
        out = await graph.ainvoke({"steps": ["next"]}, run_config(thread, "r4"))
        assert out["steps"][-4:] == ["next", "a", "b", "c"]


# -- a release that fails is not the run's end --------------------------------------------


class _TakeThePool(BaseCallbackHandler):
    """When the graph call ends, holds the pool's only connection for a while: the
    saver's release (the next callback) cannot get one and fails, as in a burst that
    exhausted the pool."""

    run_inline = True

    def __init__(self, pool: ConnectionPool[Any], hold: float) -> None:
        self.pool, self.hold = pool, hold

    def on_chain_end(self, outputs: Any, *, parent_run_id: Any = None, **kw: Any) -> None:
        if parent_run_id is not None:
            return
        taken = threading.Event()

        def take() -> None:
            with self.pool.connection():
                taken.set()
                time.sleep(self.hold)

        threading.Thread(target=take, daemon=True).start()
        taken.wait(5)


def test_a_release_that_cannot_get_a_connection_is_retried(db: str) -> None:
    """The release of a run that returned fails (the pool has no connection for it in
    time): the run must not read unfinished once its lease expires. The saver retries
    the release; the next run is admitted."""
    thread = "release-retried"
    with ConnectionPool(
        db, min_size=1, max_size=1, timeout=0.3, kwargs={"autocommit": True}, open=True
    ) as pool:
        saver = DeterministicSaver(pool, lease_ttl=2)
        graph = build().compile(checkpointer=saver)
        config = run_config(thread, "r1")
        config["callbacks"].insert(0, _TakeThePool(pool, 0.8))
        graph.invoke({"steps": ["in"]}, config)
        time.sleep(2.5)  # past the lease's expiry
        assert _lease(db, thread) == ("r1", "ok")
        out = graph.invoke({"steps": ["next"]}, run_config(thread, "r2"))
        assert out["steps"][-4:] == ["next", "a", "b", "c"]
        saver.close()


# -- two attempts of one run at once ---------------------------------------------------------


def build_journaled() -> StateGraph[Any]:
    """a -> b, each node doing one durable op (for the PostgresJournal twins)."""
    from langgraph_deterministic.runner import durable_sync

    def node(name: str) -> Any:
        def run(state: S) -> dict[str, Any]:
            return {"steps": [durable_sync(f"op-{name}", lambda: name)]}

        return run

    g = StateGraph(S)
    g.add_node("a", node("a"))
    g.add_node("b", node("b"))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def twins(saver: DeterministicSaver, thread: str, journal: bool) -> list[str]:
    """A finished run r0, then two attempts of run r1 started at once (threads behind a
    barrier); then checks what the contract promises and starts run r2. Returns the two
    attempts' outcomes."""
    from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal

    graph = (build_journaled() if journal else build()).compile(checkpointer=saver)
    if journal:
        runner = DeterministicRunner(journal=PostgresJournal(saver))

        def call(inp: Any, config: Any) -> Any:
            return runner.invoke(graph, inp, config, durability="sync")
    else:

        def call(inp: Any, config: Any) -> Any:
            return graph.invoke(inp, config, durability="sync")

    tail = ["a", "b"] if journal else ["a", "b", "c"]
    call({"steps": ["in0"]}, run_config(thread, "r0"))
    gate = threading.Barrier(2)
    outcomes: list[str] = []

    def attempt() -> None:
        gate.wait(10)
        try:
            out = call({"steps": ["in1"]}, run_config(thread, "r1"))
            assert out["steps"][-len(tail) - 1 :] == ["in1", *tail]
            outcomes.append("ok")
        except ConcurrentRunError:
            outcomes.append("ConcurrentRunError")

    workers = [threading.Thread(target=attempt) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert "ok" in outcomes and set(outcomes) <= {"ok", "ConcurrentRunError"}, outcomes
    record = saver.get_run(thread, "r1")
    assert record is not None and record.status == "done"  # finished, not yet followed
    assert record.lease is not None and record.lease.ended == "ok", record.lease
    out = call({"steps": ["in2"]}, run_config(thread, "r2"))  # admitted at once
    assert out["steps"] == ["in0", *tail, "in1", *tail, "in2", *tail]  # each input once
    record = saver.get_run(thread, "r1")
    assert record is not None and record.status == "done"
    return outcomes


@pytest.mark.parametrize("journal", [False, True], ids=["saver", "journal"])
def test_of_two_attempts_of_one_run_at_once_exactly_one_finishes_it(db: str, journal: bool) -> None:
    with DeterministicSaver(db) as saver:
        seen = [tuple(sorted(twins(saver, f"twins-{journal}-{i}", journal))) for i in range(10)]
    assert ("ConcurrentRunError", "ok") in seen or all(s == ("ok", "ok") for s in seen)


_LATE_RETRY = """
import os, sys, time
from tests.contract.test_races import build
from langgraph_deterministic import DeterministicSaver, run_config
db, thread, run, text, go = sys.argv[1:6]
with DeterministicSaver(db) as saver:
    graph = build().compile(checkpointer=saver)
    graph.get_state({"configurable": {"thread_id": "warm"}})
    open(go + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    graph.invoke({"steps": [text]}, run_config(thread, run))
"""


@pytest.mark.parametrize("ms", [0, 15])
def test_a_killed_late_retry_of_a_finished_run_changes_nothing(
    db: str, tmp_path: Path, ms: int
) -> None:
    """As the cancelled one, in a process SIGKILLed ``ms`` after it calls the graph
    (scripts/contract_trials.py sweeps more delays)."""
    thread = f"late-killed-{ms}"
    with DeterministicSaver(db) as saver:
        graph = build().compile(checkpointer=saver)
        graph.invoke({"steps": ["in0"]}, run_config(thread, "r0"))
        go = tmp_path / "go"
        proc = subprocess.Popen(
            [sys.executable, "-c", _LATE_RETRY, db, thread, "r0", "in0", str(go)],
            stderr=subprocess.PIPE,
        )
        while not Path(f"{go}.ready").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        go.touch()
        time.sleep(ms / 1000)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert _lease(db, thread) == ("r0", "ok")
        out = graph.invoke({"steps": ["in1"]}, run_config(thread, "r1"))
        assert out["steps"] == ["in0", "a", "b", "c", "in1", "a", "b", "c"]


# -- the listener that wakes enqueue waiters -----------------------------------------------


def test_a_release_wakes_the_waiter_whose_ticket_it_names(db: str) -> None:
    """A waiter is woken by the NOTIFY lgd_wake_queue_v4 sends, not by its pause running
    out (which would take the 30 s given here); another ticket stays asleep."""
    from langgraph_deterministic.checkpointer._admission import queue_channel
    from langgraph_deterministic.checkpointer._waiting import listener_for

    listener = listener_for(db, {})
    channel = queue_channel("wake-me")
    woken: dict[int, bool] = {}

    def wait(ticket: int, seconds: float) -> None:
        woken[ticket] = listener.wait(channel, ticket, seconds)

    first = threading.Thread(target=wait, args=(7, 30.0))
    other = threading.Thread(target=wait, args=(8, 1.0))
    first.start()
    other.start()
    assert listener.listening(10)
    with psycopg.connect(db, autocommit=True) as conn:
        # what a release of the thread's lease sends when ticket 7 is the first live one
        # (again until it wakes: the waiter may register after the listener is up)
        while first.is_alive():
            conn.execute("SELECT pg_notify('lgd_queue', %s)", (f"{channel} 7",))
            first.join(0.2)
    first.join(30)
    other.join(30)
    listener.close()
    assert woken == {7: True, 8: False}
