"""PostgresJournal on a real Postgres, in one process: replay, outcomes, fencing, retention.

Crashes across real OS processes (SIGKILL) are in test_journal_processes.py.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from pydantic import BaseModel
from typing_extensions import TypedDict

import langgraph_deterministic
from langgraph_deterministic import (
    ConcurrentRunError,
    ConfigurationError,
    DeterministicSaver,
    JournaledOpError,
    JournalLimitError,
    NondeterminismError,
    UnsafeDataError,
    run_config,
)
from langgraph_deterministic.runner import (
    DeterministicRunner,
    PostgresJournal,
    durable,
    durable_sync,
    idempotency_key,
    is_transient,
)


class S(TypedDict, total=False):
    r: Annotated[list[Any], operator.add]


class Invoice(BaseModel):
    id: str
    cents: int


class Crash(BaseException):
    """Stands in for the process dying: escapes LangGraph, nothing after it is stored."""



@pytest.fixture
def saver(db: str) -> Iterator[DeterministicSaver]:
    with DeterministicSaver(db) as s:
        yield s


def journal_rows(db: str, thread: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT op_key, status, executions FROM lgd_journal WHERE thread_id = %s "
            "ORDER BY task_ns, op_key",
            (thread,),
        ).fetchall()


class Ops:
    """Op functions that count their executions and can crash or fail on demand."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: dict[str, list[str]] = {}
        self.crash_at: str | None = None
        self.fail: dict[str, BaseException] = {}

    def __call__(self, name: str) -> str:
        self.calls[name] += 1
        self.keys.setdefault(name, []).append(idempotency_key())
        if self.crash_at == name:
            self.crash_at = None
            raise Crash(name)
        if name in self.fail:
            raise self.fail.pop(name)
        return f"v:{name}"


def two_op_graph(ops: Ops, **node_kw: Any) -> StateGraph[S]:
    def node(state: S) -> S:
        a = durable_sync("first", ops, "first")
        b = durable_sync("second", ops, "second")
        return {"r": [a, b]}

    g = StateGraph(S)
    g.add_node("node", node, **node_kw)
    g.add_edge(START, "node")
    g.add_edge("node", END)
    return g


# a long claim_ahead: the counts below must not depend on how loaded the machine is
@pytest.mark.parametrize("claim_ahead", [60.0, 0.0])
def test_a_retry_returns_stored_results_and_runs_the_unfinished_op_once(
    saver: DeterministicSaver, db: str, claim_ahead: float
) -> None:
    thread = f"t-retry-{claim_ahead}"
    ops = Ops()
    graph = two_op_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=claim_ahead))
    ops.crash_at = "second"
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config(thread, "run-1"), durability="sync")
    assert ops.calls == {"first": 1, "second": 1}
    # claim-ahead: "first" started on the fence check of the run's admission (which
    # registered the attempt), "second" on that of first's outcome write: no claim, so
    # second's crashed execution left no row; without it, a claim before each new op.
    assert runner.last_stats.ahead == (["first#0", "second#0"] if claim_ahead else [])
    assert runner.last_stats.round_trips == (1 if claim_ahead else 3)
    out = runner.invoke(graph, {"r": []}, run_config(thread, "run-1"), durability="sync")
    assert out["r"] == ["v:first", "v:second"]
    assert ops.calls == {"first": 1, "second": 2}
    assert runner.last_stats.replayed == ["first#0"]
    assert runner.last_stats.executed == ["second#0"]
    # the op run again kept its idempotency key
    assert ops.keys["second"][0] == ops.keys["second"][1]
    assert ops.keys["first"][0] != ops.keys["second"][0]
    # the retry: a claim that replays first and checks the fence, then second runs on it
    assert runner.last_stats.round_trips == (2 if claim_ahead else 3)
    executions = 1 if claim_ahead else 2  # executions counts claims (or the first store)
    assert journal_rows(db, thread) == [("first#0", "ok", 1), ("second#0", "ok", executions)]


async def test_async_nodes_gather_and_parallel_branches(db: str) -> None:
    ops = Ops()
    crash = {"armed": True}

    async def gathered(state: S) -> S:
        a, b, c = await asyncio.gather(
            durable("g1", ops, "g1"), durable("g2", ops, "g2"), durable("g3", ops, "g3")
        )
        return {"r": [a, b, c]}

    async def branch(state: S) -> S:
        x = await durable("x", ops, "x")
        await asyncio.sleep(0.05)  # the gather in the other branch finishes first
        if crash["armed"]:
            crash["armed"] = False
            raise Crash("branch")
        return {"r": [x]}

    g = StateGraph(S)
    g.add_node("gathered", gathered)
    g.add_node("branch", branch)
    g.add_edge(START, "gathered")
    g.add_edge(START, "branch")
    async with DeterministicSaver(db) as asaver:
        graph = g.compile(checkpointer=asaver)
        runner = DeterministicRunner(journal=PostgresJournal(asaver))
        config = run_config("t-gather", "run-1")
        with pytest.raises(Crash):
            await runner.ainvoke(graph, {"r": []}, config)
        out = await runner.ainvoke(graph, {"r": []}, config)
    assert sorted(out["r"]) == ["v:g1", "v:g2", "v:g3", "v:x"]
    assert ops.calls == {"g1": 1, "g2": 1, "g3": 1, "x": 1}


def test_terminal_errors_are_stored_transient_ones_are_not(saver: DeterministicSaver) -> None:
    ops = Ops()
    graph = two_op_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    ops.fail["first"] = ValueError("card declined")
    with pytest.raises(ValueError, match="card declined"):
        runner.invoke(graph, {"r": []}, run_config("t-terminal", "run-1"))
    # the retry gets the same failure back without running the op
    with pytest.raises(ValueError, match="card declined"):
        runner.invoke(graph, {"r": []}, run_config("t-terminal", "run-1"))
    assert ops.calls["first"] == 1

    ops.fail["first"] = ConnectionError("provider unreachable")
    with pytest.raises(ConnectionError):
        runner.invoke(graph, {"r": []}, run_config("t-transient", "run-1"))
    out = runner.invoke(graph, {"r": []}, run_config("t-transient", "run-1"))
    assert out["r"] == ["v:first", "v:second"]
    assert ops.calls["first"] == 3


def test_an_error_type_that_cannot_be_rebuilt_comes_back_as_journaled_op_error(
    saver: DeterministicSaver,
) -> None:
    class Local(ValueError):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    def node(state: S) -> S:
        def boom() -> None:
            raise Local(1, 2)

        durable_sync("boom", boom)
        return {}

    graph = StateGraph(S)
    graph.add_node("n", node)
    graph.add_edge(START, "n")
    compiled = graph.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    with pytest.raises(Local):
        runner.invoke(compiled, {"r": []}, run_config("t-local", "run-1"))
    with pytest.raises(JournaledOpError, match="Local: 1/2"):
        runner.invoke(compiled, {"r": []}, run_config("t-local", "run-1"))


def test_a_node_retried_by_its_retry_policy_finds_its_stored_ops(
    saver: DeterministicSaver,
) -> None:
    ops = Ops()
    ops.fail["second"] = ConnectionError("flaky")
    policy = RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)
    graph = two_op_graph(ops, retry_policy=policy).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    out = runner.invoke(graph, {"r": []}, run_config("t-policy", "run-1"))
    assert out["r"] == ["v:first", "v:second"]
    assert ops.calls == {"first": 1, "second": 2}
    assert ops.keys["second"][0] == ops.keys["second"][1]


@pytest.mark.parametrize("registered", [True, False])
def test_results_go_through_the_savers_serde(db: str, registered: bool) -> None:
    """Including its allow-list: a replayed result of a type of the user's comes back when
    the saver registers it, and is refused (not run, not half-decoded) when it does not."""
    values = {
        "message": AIMessage(content="hi", id="m1"),
        "model": Invoice(id="i1", cents=1200),
        "bytes": b"\x00\xff",
        "list": [1, "a"],
    }
    seen: list[dict[str, Any]] = []

    def node(state: S) -> S:
        got = {k: durable_sync(f"v:{k}", lambda v=v: v) for k, v in values.items()}
        seen.append(got)
        if len(seen) == 1:
            raise Crash("after the ops")
        return {}

    g = StateGraph(S)
    g.add_node("n", node)
    g.add_edge(START, "n")
    thread = f"t-serde-{registered}"
    with DeterministicSaver(db, allowed_types=[Invoice] if registered else ()) as saver:
        graph = g.compile(checkpointer=saver)
        runner = DeterministicRunner(journal=PostgresJournal(saver))
        with pytest.raises(Crash):
            runner.invoke(graph, {"r": []}, run_config(thread, "run-1"))
        if not registered:
            with pytest.raises(UnsafeDataError, match=r"Invoice.*allowed_types"):
                runner.invoke(graph, {"r": []}, run_config(thread, "run-1"))
            return
        runner.invoke(graph, {"r": []}, run_config(thread, "run-1"))
        assert runner.last_stats.executed == []
        assert seen[1] == values


def test_a_result_over_the_size_limit_is_refused_clearly(saver: DeterministicSaver, db: str) -> None:
    def node(state: S) -> S:
        durable_sync("big", lambda: "x" * 5000)
        return {}

    g = StateGraph(S)
    g.add_node("n", node)
    g.add_edge(START, "n")
    runner = DeterministicRunner(journal=PostgresJournal(saver, max_result_bytes=1000))
    with pytest.raises(JournalLimitError, match="max_result_bytes=1000"):
        runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-big", "run-1"))
    # no row: the op ran on the admission's fence check and nothing was stored; a retry
    # runs it again
    assert journal_rows(db, "t-big") == []


def test_ops_before_an_interrupt_are_not_run_again_on_resume(saver: DeterministicSaver) -> None:
    ops = Ops()

    def node(state: S) -> S:
        charged = durable_sync("charge", ops, "charge")
        answer = interrupt("confirm?")
        return {"r": [charged, answer]}

    g = StateGraph(S)
    g.add_node("n", node)
    g.add_edge(START, "n")
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    runner.invoke(graph, {"r": []}, run_config("t-hitl", "run-1"))
    out = runner.invoke(graph, Command(resume="yes"), run_config("t-hitl", "run-2"))
    assert out["r"] == ["v:charge", "yes"]
    assert ops.calls == {"charge": 1}


def test_ops_in_a_subgraph_are_keyed_under_its_task(saver: DeterministicSaver) -> None:
    ops = Ops()
    crash = {"armed": True}

    def inner(state: S) -> S:
        a = durable_sync("inner", ops, "inner")
        if crash["armed"]:
            crash["armed"] = False
            raise Crash("in the subgraph")
        return {"r": [a]}

    sub = StateGraph(S)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    g = StateGraph(S)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "sub")
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-sub", "run-1"), durability="sync")
    out = runner.invoke(graph, {"r": []}, run_config("t-sub", "run-1"), durability="sync")
    assert out["r"] == ["v:inner"]
    assert ops.calls == {"inner": 1}


def test_a_fenced_attempt_runs_no_op_and_stores_no_result(saver: DeterministicSaver, db: str) -> None:
    """Attempt A stalls inside op "pay"; attempt B of the same run takes the run over at
    its admission and finishes it. A's result is refused, and A's next op never runs."""
    in_pay, release = threading.Event(), threading.Event()
    calls: Counter[str] = Counter()

    def pay() -> str:
        calls[f"pay:{threading.current_thread().name}"] += 1
        if threading.current_thread().name == "A":
            in_pay.set()
            release.wait(30)
        return "paid"

    def node(state: S) -> S:
        return {"r": [durable_sync("pay", pay)]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    graph = g.compile(checkpointer=saver)
    config = run_config("t-fence", "run-1")
    results: dict[str, Any] = {}

    def attempt(name: str) -> None:
        # A runs pay on its admission (claim-ahead), whatever the machine's load: with the
        # default 0.1 s window a busy machine let A claim first, and B then took A's claim
        # over (executions 2). B claims before its op.
        claim_ahead = 60 if name == "A" else 0
        runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=claim_ahead))
        try:
            results[name] = runner.invoke(graph, {"r": []}, config, durability="sync")
        except BaseException as exc:
            results[name] = exc
        results[f"{name}-stats"] = runner.last_stats

    a = threading.Thread(target=attempt, args=("A",), name="A")
    a.start()
    assert in_pay.wait(30)
    b = threading.Thread(target=attempt, args=("B",), name="B")
    b.start()
    b.join(60)
    assert results["B"] == {"r": ["paid"]}
    release.set()
    a.join(60)
    assert isinstance(results["A"], ConcurrentRunError), results["A"]
    assert calls == {"pay:A": 1, "pay:B": 1}
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT status, executions FROM lgd_journal WHERE thread_id = 't-fence'"
        ).fetchone()
        fenced = conn.execute(
            "SELECT count(*) FROM lgd_journal_attempts WHERE thread_id = 't-fence' "
            "AND fenced_by IS NOT NULL"
        ).fetchone()
    # pay ran on A's admission (no claim, no row), so B's claim found it unclaimed; A was
    # fenced off by B's admission
    assert row == ("ok", 1) and fenced == (1,)
    assert results["A-stats"].ahead == ["pay#0"] and results["B-stats"].ahead == []


def test_a_fenced_attempt_gets_concurrent_run_error_before_its_next_op_runs(
    saver: DeterministicSaver,
) -> None:
    """Two parallel branches of attempt A: one stalls in an op that B takes over; the other
    then asks for a new op, which is refused without running."""
    in_slow, b_done, release = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []
    who = threading.local()

    def slow() -> str:
        ran.append(f"slow:{who.name}")
        if who.name == "A":
            in_slow.set()
            release.wait(30)
        return "slow"

    def late() -> str:
        ran.append(f"late:{who.name}")
        return "late"

    def left(state: S) -> S:
        return {"r": [durable_sync("slow", slow)]}

    def right(state: S) -> S:
        if who.name == "A":
            b_done.wait(30)
        return {"r": [durable_sync("late", late)]}

    config = run_config("t-fence-2", "run-1")
    results: dict[str, Any] = {}

    def attempt(name: str) -> None:
        runner = DeterministicRunner(journal=PostgresJournal(saver))

        def mark(fn: Any) -> Any:
            def wrapped(*a: Any, **k: Any) -> Any:
                who.name = name
                return fn(*a, **k)

            return wrapped

        g2 = StateGraph(S)
        g2.add_node("left", mark(left))
        g2.add_node("right", mark(right))
        g2.add_edge(START, "left")
        g2.add_edge(START, "right")
        try:
            results[name] = runner.invoke(
                g2.compile(checkpointer=saver), {"r": []}, config, durability="sync"
            )
        except BaseException as exc:
            results[name] = exc

    a = threading.Thread(target=attempt, args=("A",))
    a.start()
    assert in_slow.wait(30)
    b = threading.Thread(target=attempt, args=("B",))
    b.start()
    b.join(60)
    assert sorted(results["B"]["r"]) == ["late", "slow"]
    b_done.set()
    release.set()
    a.join(60)
    assert isinstance(results["A"], ConcurrentRunError)
    assert sorted(ran) == ["late:B", "slow:A", "slow:B"]  # A never ran "late"


def test_retention_follows_the_thread(saver: DeterministicSaver, db: str) -> None:
    ops = Ops()
    graph = two_op_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    for thread in ("keep-a", "keep-b", "gone"):
        runner.invoke(graph, {"r": []}, run_config(thread, f"{thread}-run"))
    saver.copy_thread("keep-a", "keep-a-copy")
    assert len(journal_rows(db, "keep-a-copy")) == 2
    saver.delete_thread("gone")
    assert journal_rows(db, "gone") == []
    saver.delete_for_runs(["keep-b-run"])
    assert journal_rows(db, "keep-b") == []
    # keep_latest: ops of tasks that ran from deleted checkpoints go with them
    runner.invoke(graph, {"r": []}, run_config("keep-a", "keep-a-run-2"))
    assert len(journal_rows(db, "keep-a")) == 4
    saver.prune(["keep-a"], strategy="keep_latest")
    assert journal_rows(db, "keep-a") == []
    with psycopg.connect(db) as conn:
        left = conn.execute(
            "SELECT count(*) FROM lgd_journal_attempts WHERE thread_id IN ('gone', 'keep-b')"
        ).fetchone()
    assert left == (0,)


def test_misuse_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="inside the function you pass"):
        idempotency_key()
    with pytest.raises(ConfigurationError, match="DeterministicSaver"):
        PostgresJournal(object())  # type: ignore[arg-type]
    # outside a runner, durable_sync just calls, and a key is refused there: one that
    # changed on every retry would defeat it, and graph.invoke meant as runner.invoke
    # must fail loudly (docs/how-to/durable-ops-without-restate.md)
    assert durable_sync("x", lambda a: a + 1, 1) == 2
    with pytest.raises(ConfigurationError, match="inside the function you pass"):
        durable_sync("charge", idempotency_key)
    assert langgraph_deterministic.durable_sync is durable_sync
    assert langgraph_deterministic.idempotency_key is idempotency_key


def test_nested_ops_and_ops_outside_a_graph_are_refused(saver: DeterministicSaver) -> None:
    def node(state: S) -> S:
        durable_sync("outer", lambda: durable_sync("inner", lambda: 1))
        return {}

    g = StateGraph(S)
    g.add_node("n", node)
    g.add_edge(START, "n")
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    with pytest.raises(NondeterminismError, match="inside durable op"):
        runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-nest", "r"))
    no_saver = StateGraph(S)
    no_saver.add_node("n", lambda s: {"r": [durable_sync("x", lambda: 1)]})
    no_saver.add_edge(START, "n")
    with pytest.raises(ConfigurationError, match="checkpointer and thread_id"):
        runner.invoke(no_saver.compile(), {"r": []})


def test_sync_api_needs_a_keyed_journal() -> None:
    from .fake_journal import FakeAttempt, FakeJournal, Store

    runner = DeterministicRunner(journal=FakeJournal(FakeAttempt(Store(), io_ticks=lambda n: 1)))
    with pytest.raises(ConfigurationError, match="keyed journal"):
        runner.invoke(StateGraph(S), {})


def test_async_commit_stores_outcomes_the_same_way(saver: DeterministicSaver, db: str) -> None:
    ops = Ops()
    graph = two_op_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(
        journal=PostgresJournal(saver, synchronous_commit=False, claim_ahead=60)
    )
    ops.crash_at = "second"
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-async-commit", "run-1"))
    runner.invoke(graph, {"r": []}, run_config("t-async-commit", "run-1"))
    assert ops.calls == {"first": 1, "second": 2}
    # "second" ran on claim-ahead both times: executions counts claims
    assert journal_rows(db, "t-async-commit") == [("first#0", "ok", 1), ("second#0", "ok", 1)]


def _fence_off(db: str, attempt: str) -> None:
    """Another attempt's takeover, committed: what a retry's first claim does."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgd_journal_attempts SET fenced_by = 'retry', fenced_at = clock_timestamp() "
            "WHERE attempt = %s",
            (attempt,),
        )


def three_op_graph(ops: Ops, between: Any) -> StateGraph[S]:
    def node(state: S) -> S:
        a = durable_sync("a", ops, "a")
        between()
        b = durable_sync("b", ops, "b")
        c = durable_sync("c", ops, "c")
        return {"r": [a, b, c]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    return g


def test_claim_ahead_one_round_trip_per_new_op_and_zero_per_replayed_op(
    saver: DeterministicSaver,
) -> None:
    ops = Ops()
    graph = three_op_graph(ops, lambda: None).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    ops.crash_at = "c"
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-ahead", "run-1"), durability="sync")
    # a: store only (ran on the run's admission), b: store only (on a's store's fence
    # check); c: crashed
    assert runner.last_stats.ahead == ["a#0", "b#0", "c#0"]
    assert runner.last_stats.round_trips == 2
    out = runner.invoke(graph, {"r": []}, run_config("t-ahead", "run-1"), durability="sync")
    assert out["r"] == ["v:a", "v:b", "v:c"]
    # one claim read the task's outcomes: a and b replay with no statement, c runs on it
    assert runner.last_stats.replayed == ["a#0", "b#0"]
    assert runner.last_stats.ahead == ["c#0"]
    assert runner.last_stats.round_trips == 2
    assert ops.calls == {"a": 1, "b": 1, "c": 2}


def bench_graph(sync: bool) -> StateGraph[S]:
    """benchmarks/bench_journal.py's graph: 4 sequential nodes x 5 durable ops."""
    g = StateGraph(S)
    prev = START
    for n in range(4):
        if sync:

            def node(state: S) -> S:
                return {"r": [durable_sync(f"op{i}", str, i) for i in range(5)]}

        else:

            async def node(state: S) -> S:  # type: ignore[misc]
                async def op(i: int) -> str:
                    return str(i)

                return {"r": [await durable(f"op{i}", op, i) for i in range(5)]}

        g.add_node(f"n{n}", node)
        g.add_edge(prev, f"n{n}")
        prev = f"n{n}"
    return g


@pytest.mark.parametrize("api", ["sync", "async"])
def test_the_journal_adds_exactly_one_round_trip_and_one_statement_per_new_op(
    db: str, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """bench_journal's graph run, 20 new ops in 4 tasks, counted at the driver: with the
    journal it costs exactly 20 round trips and 20 statements more than the same graph
    run bare (durable() just calling). No claim at all: the first op runs on the run's
    admission, which registered the attempt inside the statement the saver sends anyway
    (lgd_journal_admit_v2 in place of lgd_admit_v4, in the head read's pipeline); every
    later op on the fence check of an earlier outcome write."""
    from langgraph_deterministic.checkpointer import saver as saver_module

    batches: list[list[str]] = []

    def names(batch: Any) -> list[str]:
        return [st.sql.split("(")[0].split()[-1] for st in batch.statements]

    real, areal = saver_module.execute, saver_module.aexecute

    def execute(conn: Any, batch: Any) -> Any:
        batches.append(names(batch))
        return real(conn, batch)

    async def aexecute(conn: Any, batch: Any) -> Any:
        batches.append(names(batch))
        return await areal(conn, batch)

    monkeypatch.setattr(saver_module, "execute", execute)
    monkeypatch.setattr(saver_module, "aexecute", aexecute)

    def counted(out: Any) -> list[list[str]]:
        assert out["r"] == [str(i) for i in range(5)] * 4
        taken = [b for b in batches if b != ["renew_leases"]]  # the heartbeat, if it beat
        batches.clear()
        return taken

    # buffer_writes=0: every put_writes is a round trip of its own, whatever the timing
    def run_sync() -> tuple[list[list[str]], list[list[str]], Any]:
        with DeterministicSaver(db, buffer_writes=0) as saver:
            graph = bench_graph(True).compile(checkpointer=saver)
            runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
            batches.clear()
            bare = counted(graph.invoke({"r": []}, run_config("t-count-sync-0", "r")))
            journaled = counted(
                runner.invoke(graph, {"r": []}, run_config("t-count-sync-1", "r"))
            )
            return bare, journaled, runner.last_stats

    async def run_async() -> tuple[list[list[str]], list[list[str]], Any]:
        async with DeterministicSaver(db, buffer_writes=0) as saver:
            graph = bench_graph(False).compile(checkpointer=saver)
            runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
            batches.clear()
            bare = counted(await graph.ainvoke({"r": []}, run_config("t-count-async-0", "r")))
            journaled = counted(
                await runner.ainvoke(graph, {"r": []}, run_config("t-count-async-1", "r"))
            )
            return bare, journaled, runner.last_stats

    bare, journaled, stats = run_sync() if api == "sync" else asyncio.run(run_async())
    assert stats.round_trips == 20 and len(stats.ahead) == 20 and stats.fenced == []
    assert len(journaled) == len(bare) + 20, (bare, journaled)
    assert sum(map(len, journaled)) == sum(map(len, bare)) + 20
    assert bare[0][0] == "lgd_admit_v4" and journaled[0][0] == "lgd_journal_admit_v2"
    assert journaled[0][1:] == bare[0][1:]  # the same head read, in the same pipeline
    # every other batch the same, statement for statement (in the order writes completed)
    saver_batches = [b for b in journaled[1:] if b != ["lgd_journal_store_v4"]]
    assert sorted(saver_batches) == sorted(bare[1:])


def test_a_takeover_before_the_fence_check_stops_the_next_op_before_it_runs(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits while op a runs: a's outcome is still stored (its claim was
    not taken over), but its store finds the attempt fenced, so b gets no claim-ahead:
    its claim raises ConcurrentRunError before b's function runs. (a claims: the node
    waits out the admission's fence check first.)"""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0.05))

    def a_then_takeover(name: str) -> str:
        _fence_off(db, runner.last_stats.attempt)
        return ops(name)

    def node(state: S) -> S:
        threading.Event().wait(0.1)
        a = durable_sync("a", a_then_takeover, "a")
        b = durable_sync("b", ops, "b")
        return {"r": [a, b]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(ConcurrentRunError, match="lost the thread"):
        runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-ahead-fence", "run-1"))
    assert ops.calls == {"a": 1}
    assert runner.last_stats.fenced == ["b#0"] and runner.last_stats.ahead == []
    assert journal_rows(db, "t-ahead-fence") == [("a#0", "ok", 1)]


def test_a_takeover_after_the_admission_refuses_the_first_outcome(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits after the run's admission registered the attempt (node code
    before the first op): a started on the admission's check, as an op claimed just
    before the takeover would have; its outcome is refused and b never runs here."""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))

    def node(state: S) -> S:
        _fence_off(db, runner.last_stats.attempt)
        return {"r": [durable_sync("a", ops, "a"), durable_sync("b", ops, "b")]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with pytest.raises(ConcurrentRunError, match="was not stored"):
        runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-adm-late", "r"))
    assert ops.calls == {"a": 1}
    assert runner.last_stats.ahead == ["a#0"] and runner.last_stats.round_trips == 1
    assert journal_rows(db, "t-adm-late") == []


def test_a_retrys_admission_fences_the_attempt_before_its_first_op(
    saver: DeterministicSaver, db: str
) -> None:
    """Attempt A was admitted (its attempt registered) and waits before its first op; a
    retry B of the run is admitted, which takes the run over, and claims that op. A's op,
    asked for while B runs it, raises ConcurrentRunError without running: B's admission
    had fenced A off (B's claim alone would not have: A had no claim to take over, and
    A's claim would have taken the op over from B)."""
    a_waits, b_in_op, a_done = threading.Event(), threading.Event(), threading.Event()
    calls: Counter[str] = Counter()

    def pay() -> str:
        calls[threading.current_thread().name] += 1
        if threading.current_thread().name == "B":
            b_in_op.set()
            assert a_done.wait(30)
        return "paid"

    def node(state: S) -> S:
        if threading.current_thread().name == "A":
            a_waits.set()
            assert b_in_op.wait(30)
            threading.Event().wait(0.1)  # past A's claim_ahead: its op claims
        return {"r": [durable_sync("pay", pay)]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    graph = g.compile(checkpointer=saver)
    results: dict[str, Any] = {}

    def attempt(name: str) -> None:
        runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0.05))
        config = run_config("t-adm-fence", "run-1")  # one per call, as a worker makes it
        try:
            results[name] = runner.invoke(graph, {"r": []}, config, durability="sync")
        except BaseException as exc:
            results[name] = exc
        finally:
            if name == "A":
                a_done.set()
        results[f"{name}-stats"] = runner.last_stats

    a = threading.Thread(target=attempt, args=("A",), name="A")
    a.start()
    assert a_waits.wait(30)
    b = threading.Thread(target=attempt, args=("B",), name="B")
    b.start()
    a.join(60)
    b.join(60)
    assert isinstance(results["A"], ConcurrentRunError), results["A"]
    assert "lost the thread" in str(results["A"])
    assert results["B"] == {"r": ["paid"]}
    assert calls == {"B": 1}
    assert results["A-stats"].fenced == ["pay#0"] and results["A-stats"].executed == []
    with psycopg.connect(db) as conn:
        fenced = conn.execute(
            "SELECT attempt, fenced_by FROM lgd_journal_attempts WHERE thread_id = %s "
            "ORDER BY fenced_by NULLS LAST",
            ("t-adm-fence",),
        ).fetchall()
    a_token, b_token = results["A-stats"].attempt, results["B-stats"].attempt
    assert fenced == [(a_token, b_token), (b_token, None)]


def test_a_refused_admission_leaves_the_journal_as_it_was(
    saver: DeterministicSaver, db: str
) -> None:
    """A retry with another input under the same run id is admitted, registered and then
    refused by the start checks: its registration is undone with its lease, so the
    attempt it had fenced off holds the run again and finishes it on its admission's
    fence checks, one statement per op."""
    ops = Ops()
    a_waits, b_refused = threading.Event(), threading.Event()

    def node(state: S) -> S:
        a_waits.set()
        assert b_refused.wait(30)
        return {"r": [durable_sync("a", ops, "a"), durable_sync("b", ops, "b")]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    results: dict[str, Any] = {}

    def first() -> None:
        config = run_config("t-adm-undo", "run-1")
        results["A"] = runner.invoke(graph, {"r": ["x"]}, config, durability="sync")

    a = threading.Thread(target=first)
    a.start()
    assert a_waits.wait(30)
    with psycopg.connect(db) as conn:
        before = conn.execute(
            "SELECT thread_id, attempt, run_id, fenced_by, fenced_at, created_at "
            "FROM lgd_journal_attempts ORDER BY 1, 2"
        ).fetchall()
    retry = DeterministicRunner(journal=PostgresJournal(saver))
    with pytest.raises(langgraph_deterministic.RunInputMismatchError):
        retry.invoke(graph, {"r": ["other"]}, run_config("t-adm-undo", "run-1"))
    with psycopg.connect(db) as conn:
        after = conn.execute(
            "SELECT thread_id, attempt, run_id, fenced_by, fenced_at, created_at "
            "FROM lgd_journal_attempts ORDER BY 1, 2"
        ).fetchall()
    b_refused.set()
    a.join(60)
    assert after == before
    assert [row[1] for row in before if row[0] == "t-adm-undo"] == [runner.last_stats.attempt]
    assert results["A"] == {"r": ["x", "v:a", "v:b"]}
    assert runner.last_stats.ahead == ["a#0", "b#0"] and runner.last_stats.round_trips == 2



def test_a_takeover_after_the_fence_check_refuses_the_outcome(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits after a's store checked the fence (node code between two ops):
    b started on that check, as an op claimed just before a takeover would have; its
    outcome is refused, so the retry runs it (at least once) and c never runs here."""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    graph = three_op_graph(ops, lambda: _fence_off(db, runner.last_stats.attempt))
    with pytest.raises(ConcurrentRunError, match="was not stored"):
        runner.invoke(graph.compile(checkpointer=saver), {"r": []}, run_config("t-late", "run-1"))
    assert ops.calls == {"a": 1, "b": 1}
    assert runner.last_stats.ahead == ["a#0", "b#0"]
    assert journal_rows(db, "t-late") == [("a#0", "ok", 1)]


def test_claim_ahead_expires(saver: DeterministicSaver) -> None:
    """Node code slower than claim_ahead between two ops: the next op claims first."""
    ops = Ops()
    graph = three_op_graph(ops, lambda: threading.Event().wait(0.05))
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0.01))
    runner.invoke(graph.compile(checkpointer=saver), {"r": []}, run_config("t-exp", "run-1"))
    assert "b#0" not in runner.last_stats.ahead  # its fence check was 50 ms old
    # a: on the admission's check, if fresh; c: on b's store's check, if fresh
    assert runner.last_stats.round_trips in (4, 5, 6)
    with pytest.raises(ConfigurationError, match="claim_ahead"):
        PostgresJournal(saver, claim_ahead=-1)


# --- a task's first op on the previous task's fence check ---------------------------------


def chain_graph(ops: Ops, between: Any = lambda: None) -> StateGraph[S]:
    """n0: ops a, b; then n1: ops c, d (n1 runs from the checkpoint the run wrote after n0)."""

    def n0(state: S) -> S:
        out = [durable_sync("a", ops, "a"), durable_sync("b", ops, "b")]
        between()
        return {"r": out}

    def n1(state: S) -> S:
        return {"r": [durable_sync("c", ops, "c"), durable_sync("d", ops, "d")]}

    g = StateGraph(S)
    g.add_node("n0", n0)
    g.add_node("n1", n1)
    g.add_edge(START, "n0")
    g.add_edge("n0", "n1")
    return g


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_tasks_first_op_needs_no_claim_when_this_run_created_its_checkpoint(
    saver: DeterministicSaver, db: str, durability: Any
) -> None:
    thread = f"t-cross-{durability}"
    ops = Ops()
    graph = chain_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    ops.crash_at = "d"
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config(thread, "run-1"), durability=durability)
    # no claim: a runs on the run's admission (which registered the attempt), c on b's
    # store's check: nobody else can have rows of a task of a checkpoint this run created
    # after its attempt was registered
    assert runner.last_stats.ahead == ["a#0", "b#0", "c#0", "d#0"]
    assert runner.last_stats.round_trips == 3  # store a, b, c (d crashed)
    out = runner.invoke(graph, {"r": []}, run_config(thread, "run-1"), durability=durability)
    assert out["r"] == ["v:a", "v:b", "v:c", "v:d"]
    # the retry resumes n1 from a checkpoint it *loaded*: its first op claims, and that
    # claim reads c's stored outcome, so c does not run again
    assert runner.last_stats.replayed == ["c#0"]
    assert runner.last_stats.ahead == ["d#0"]
    assert runner.last_stats.round_trips == 2
    assert ops.calls == {"a": 1, "b": 1, "c": 1, "d": 2}
    assert journal_rows(db, thread) == [
        ("a#0", "ok", 1), ("b#0", "ok", 1), ("c#0", "ok", 1), ("d#0", "ok", 1),
    ]  # fmt: skip


def test_a_takeover_before_the_tasks_check_stops_the_next_tasks_first_op(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits while a runs: a's outcome is stored (its claim was not taken
    over), but its store finds the attempt fenced and returns no check, so n1's first op
    claims, and that claim raises before c's function runs. (a claims: n0 waits out the
    admission's fence check first.)"""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0.05))

    def a_then_takeover(name: str) -> str:
        _fence_off(db, runner.last_stats.attempt)
        return ops(name)

    def n0(state: S) -> S:
        threading.Event().wait(0.1)
        return {"r": [durable_sync("a", a_then_takeover, "a")]}

    def n1(state: S) -> S:
        return {"r": [durable_sync("c", ops, "c")]}

    g = StateGraph(S)
    g.add_node("n0", n0)
    g.add_node("n1", n1)
    g.add_edge(START, "n0")
    g.add_edge("n0", "n1")
    with pytest.raises(ConcurrentRunError, match="lost the thread"):
        runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-cross-fence", "r"))
    assert ops.calls == {"a": 1}
    assert runner.last_stats.fenced == ["c#0"] and runner.last_stats.ahead == []
    assert journal_rows(db, "t-cross-fence") == [("a#0", "ok", 1)]


def test_a_takeover_after_the_tasks_check_refuses_the_next_tasks_first_outcome(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits after b's store checked the fence (n0's code after its last
    op): c started on that check, as an op claimed just before the takeover would have;
    its outcome is refused and d never runs here."""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    graph = chain_graph(ops, lambda: _fence_off(db, runner.last_stats.attempt))
    with pytest.raises(ConcurrentRunError, match="was not stored"):
        runner.invoke(graph.compile(checkpointer=saver), {"r": []}, run_config("t-cross-late", "r"))
    assert ops.calls == {"a": 1, "b": 1, "c": 1}
    assert runner.last_stats.ahead == ["a#0", "b#0", "c#0"]
    assert journal_rows(db, "t-cross-late") == [("a#0", "ok", 1), ("b#0", "ok", 1)]


def test_subgraph_tasks_first_ops_skip_the_claim_only_from_checkpoints_the_run_created(
    saver: DeterministicSaver, db: str
) -> None:
    ops = Ops()
    sub = StateGraph(S)
    sub.add_node("s0", lambda s: {"r": [durable_sync("s0", ops, "s0")]})
    sub.add_node("s1", lambda s: {"r": [durable_sync("s1", ops, "s1")]})
    sub.add_edge(START, "s0")
    sub.add_edge("s0", "s1")
    g = StateGraph(S)
    g.add_node("n0", lambda s: {"r": [durable_sync("a", ops, "a")]})
    g.add_node("sub", sub.compile())
    g.add_edge(START, "n0")
    g.add_edge("n0", "sub")
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    ops.crash_at = "s1"
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-cross-sub", "r"), durability="sync")
    assert runner.last_stats.ahead == ["a#0", "s0#0", "s1#0"]
    assert runner.last_stats.round_trips == 2  # store a (ran on the admission), store s0
    out = runner.invoke(graph, {"r": []}, run_config("t-cross-sub", "r"), durability="sync")
    assert out["r"][-2:] == ["v:s0", "v:s1"]
    # the subgraph resumed from its own checkpoint, loaded: s1 claims (and runs: it had
    # crashed); s0 is not asked for again (its checkpoint is behind)
    assert runner.last_stats.ahead == []
    assert runner.last_stats.round_trips == 2
    assert ops.calls == {"a": 1, "s0": 1, "s1": 2}


def test_parallel_first_ops_share_no_fence_check(saver: DeterministicSaver, db: str) -> None:
    """Three branches start their first ops together after n0: one op per check, so at
    most one of them runs on n0's check; the others claim (or run on a later check)."""
    ops = Ops()
    g = StateGraph(S)
    g.add_node("n0", lambda s: {"r": [durable_sync("a", ops, "a")]})
    for b in ("b1", "b2", "b3"):
        g.add_node(b, lambda s, b=b: {"r": [durable_sync(b, ops, b)]})
        g.add_edge("n0", b)
    g.add_edge(START, "n0")
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    out = runner.invoke(g.compile(checkpointer=saver), {"r": []}, run_config("t-cross-par", "r"))
    assert sorted(out["r"]) == ["v:a", "v:b1", "v:b2", "v:b3"]
    ahead = runner.last_stats.ahead
    # 4 stores (a ran on the admission) + a claim for every branch that found no unused
    # check
    assert ahead[0] == "a#0" and 2 <= len(ahead) <= 4
    assert runner.last_stats.round_trips == 4 + (4 - len(ahead))
    assert ops.calls == {"a": 1, "b1": 1, "b2": 1, "b3": 1}


def test_a_task_of_a_loaded_checkpoint_claims_even_with_a_fresh_check_at_hand(
    saver: DeterministicSaver, db: str
) -> None:
    """A retry resumes two branches from the checkpoint it loaded. t1 gets a fresh fence
    check first; t2's first op must still claim (the dead attempt stored it), not start on
    t1's check: only tasks of checkpoints this run created may skip the claim."""
    ops = Ops()
    run = {"n": 1}

    def t1(state: S) -> S:
        if run["n"] == 1:
            threading.Event().wait(0.3)  # t2's op is stored
            raise Crash("t1")
        return {"r": [durable_sync("p", ops, "p"), durable_sync("q", ops, "q")]}

    def t2(state: S) -> S:
        if run["n"] == 2:
            threading.Event().wait(0.3)  # t1 has a fresh fence check by now
        out = durable_sync("r", ops, "r")
        if run["n"] == 1:
            raise Crash("t2")  # the worker dies before the task's writes are saved
        return {"r": [out]}

    g = StateGraph(S)
    g.add_node("n0", lambda s: {"r": []})
    g.add_node("t1", t1)
    g.add_node("t2", t2)
    g.add_edge(START, "n0")
    g.add_edge("n0", "t1")
    g.add_edge("n0", "t2")
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-loaded", "r"), durability="sync")
    run["n"] = 2
    runner.invoke(graph, {"r": []}, run_config("t-loaded", "r"), durability="sync")
    assert ops.calls == {"p": 1, "q": 1, "r": 1}
    assert runner.last_stats.replayed == ["r#0"] and runner.last_stats.ahead == ["q#0"]


class _Status(Exception):
    """An HTTP client's error: carries the response's status (as httpx, the OpenAI SDK)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class _Response:
    def __init__(self, status: int) -> None:
        self.status = status


class _WithResponse(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = _Response(status)


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
        _Status(503),
        _Status(429),
        _WithResponse(502),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'status_code', '')}",
)
def test_a_transient_error_after_the_side_effect_is_retried_not_replayed(
    saver: DeterministicSaver, error: BaseException
) -> None:
    """The op's side effect happened, then the call failed transiently (a timeout, a
    reset connection, a 5xx): nothing is stored, so the retry runs the op again and the
    run finishes (LangGraph's default rule would store a TimeoutError as the outcome and
    replay it on every retry)."""
    assert is_transient(error)
    ops = Ops()
    graph = two_op_graph(ops).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    thread = f"t-transient-{type(error).__name__}-{id(error)}"
    ops.fail["first"] = error
    with pytest.raises(type(error)):
        runner.invoke(graph, {"r": []}, run_config(thread, "run-1"))
    out = runner.invoke(graph, {"r": []}, run_config(thread, "run-1"))
    assert out["r"] == ["v:first", "v:second"]
    assert ops.calls["first"] == 2


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ValueError("card declined"), False),
        (KeyError("k"), False),
        (FileNotFoundError("no such file"), False),  # an OSError, but not a timeout
        (PermissionError("denied"), False),
        (_Status(404), False),
        (_Status(400), False),
        (_Status(500), True),
        (_Status(408), True),
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (KeyboardInterrupt(), True),  # never an outcome
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_what_counts_as_transient(
    saver: DeterministicSaver, error: BaseException, transient: bool
) -> None:
    assert is_transient(error) is transient
    assert PostgresJournal(saver).is_terminal(error) is (not transient)  # the default rule
