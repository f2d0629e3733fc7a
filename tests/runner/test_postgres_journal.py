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
    run_config,
)
from langgraph_deterministic.runner import (
    DeterministicRunner,
    PostgresJournal,
    durable,
    durable_sync,
    idempotency_key,
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
    # claim-ahead: "second" started on the fence check of first's outcome write (no claim),
    # so its crashed execution left no row; without it, a claim before each new op.
    assert runner.last_stats.ahead == (["second#0"] if claim_ahead else [])
    assert runner.last_stats.round_trips == (2 if claim_ahead else 3)
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
    executions = 1 if claim_ahead else 2  # executions counts claims
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


def test_results_go_through_the_savers_serde(saver: DeterministicSaver) -> None:
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
    graph = g.compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    with pytest.raises(Crash):
        runner.invoke(graph, {"r": []}, run_config("t-serde", "run-1"))
    runner.invoke(graph, {"r": []}, run_config("t-serde", "run-1"))
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
    assert journal_rows(db, "t-big") == [("big#0", "running", 1)]  # runs again on a retry


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
    """Attempt A stalls inside op "pay"; attempt B of the same run takes the op over and
    finishes the run. A's result is refused, and A's next op never runs."""
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
        runner = DeterministicRunner(journal=PostgresJournal(saver))
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
    assert row == ("ok", 2) and fenced == (1,)


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
    # outside a runner, durable_sync just calls
    assert durable_sync("x", lambda a: a + 1, 1) == 2
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
    # a: claim + store; b: store only (ran on a's store's fence check); c: crashed
    assert runner.last_stats.ahead == ["b#0", "c#0"]
    assert runner.last_stats.round_trips == 3
    out = runner.invoke(graph, {"r": []}, run_config("t-ahead", "run-1"), durability="sync")
    assert out["r"] == ["v:a", "v:b", "v:c"]
    # one claim read the task's outcomes: a and b replay with no statement, c runs on it
    assert runner.last_stats.replayed == ["a#0", "b#0"]
    assert runner.last_stats.ahead == ["c#0"]
    assert runner.last_stats.round_trips == 2
    assert ops.calls == {"a": 1, "b": 1, "c": 2}


def test_a_takeover_before_the_fence_check_stops_the_next_op_before_it_runs(
    saver: DeterministicSaver, db: str
) -> None:
    """The takeover commits while op a runs: a's outcome is still stored (its claim was
    not taken over), but its store finds the attempt fenced, so b gets no claim-ahead:
    its claim raises ConcurrentRunError before b's function runs."""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver))

    def a_then_takeover(name: str) -> str:
        _fence_off(db, runner.last_stats.attempt)
        return ops(name)

    def node(state: S) -> S:
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
    assert runner.last_stats.ahead == ["b#0"]
    assert journal_rows(db, "t-late") == [("a#0", "ok", 1)]


def test_claim_ahead_expires(saver: DeterministicSaver) -> None:
    """Node code slower than claim_ahead between two ops: the next op claims first."""
    ops = Ops()
    graph = three_op_graph(ops, lambda: threading.Event().wait(0.05))
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0.01))
    runner.invoke(graph.compile(checkpointer=saver), {"r": []}, run_config("t-exp", "run-1"))
    assert "b#0" not in runner.last_stats.ahead  # its fence check was 50 ms old
    assert runner.last_stats.round_trips in (5, 6)  # c: on b's store's check, if fresh
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
    # one claim for the run (a); c runs on b's store's check: nobody else can have rows of
    # a task of a checkpoint this run created after its first claim
    assert runner.last_stats.ahead == ["b#0", "c#0", "d#0"]
    assert runner.last_stats.round_trips == 4  # claim a, store a, b, c (d crashed)
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
    claims, and that claim raises before c's function runs."""
    ops = Ops()
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=60))

    def a_then_takeover(name: str) -> str:
        _fence_off(db, runner.last_stats.attempt)
        return ops(name)

    def n0(state: S) -> S:
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
    assert runner.last_stats.ahead == ["b#0", "c#0"]
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
    assert runner.last_stats.ahead == ["s0#0", "s1#0"]
    assert runner.last_stats.round_trips == 3  # claim a, store a, store s0
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
    assert 1 <= len(ahead) <= 3
    # 1 claim + 4 stores + a claim for every branch that found no unused check
    assert runner.last_stats.round_trips == 5 + (3 - len(ahead))
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
