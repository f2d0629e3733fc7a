"""Failover: errors that tell the truth, and runs that finish after retries.

Two kinds of test:

* On the suite's Postgres, a write the database lost is simulated by deleting the rows a
  failover would lose (a checkpoint, a durable op's claim, an attempt's registration)
  while a run is in flight: the run's next write gets a retryable
  ``DatabaseUnavailableError`` (or, for a lost claim alone, is simply stored), never
  ``ConcurrentRunError``, and a retry with the same run id finishes the run.
* With a real streaming replica (``devtools/replica.py``: ``pg_basebackup -R``, the
  primary stopped with ``-m immediate``, ``pg_ctl promote``; clients on a multi-host DSN
  with ``target_session_attrs=read-write``): one trial per replication mode, runs in
  flight (``devtools/failover.py``). ``benchmarks/failover_trials.py`` runs many.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, Any

import psycopg
import psycopg.errors
import psycopg_pool
import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic._db.translate import translate_error
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    DatabaseUnavailableError,
    is_retryable,
)
from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal, durable_sync


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


@pytest.fixture
def saver(dsn: str) -> Any:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
        yield saver


def _missing_parents(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM checkpoints c WHERE c.parent_checkpoint_id IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM checkpoints p WHERE p.thread_id = c.thread_id "
            "AND p.checkpoint_ns = c.checkpoint_ns AND p.checkpoint_id = c.parent_checkpoint_id)"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _lose_checkpoint(dsn: str, thread: str, checkpoint_id: str) -> None:
    """What a failover to a standby that never received the checkpoint's commit leaves."""
    with psycopg.connect(dsn) as conn:
        for table in ("checkpoint_writes", "checkpoints"):
            conn.execute(
                f"DELETE FROM {table} WHERE thread_id = %s AND checkpoint_id = %s",
                (thread, checkpoint_id),
            )
        conn.execute(
            "DELETE FROM lgd_chain WHERE thread_id = %s AND checkpoint_id = %s",
            (thread, checkpoint_id),
        )


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_checkpoint_on_a_lost_parent_is_refused_and_the_retry_continues(
    saver: DeterministicSaver, dsn: str, api: str
) -> None:
    thread = f"lost-parent-{api}"
    in_b, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def a(state: S) -> S:
        runs.append("a")
        return {"log": ["a"]}

    def b(state: S) -> S:
        runs.append("b")
        if len(runs) == 2:  # the first attempt only
            in_b.set()
            assert release.wait(30)
        return {"log": ["b"]}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    graph = g.compile(checkpointer=saver)
    config = run_config(thread, "run-1")
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            if api == "sync":
                graph.invoke({"log": ["in"]}, config, durability="sync")
            else:
                asyncio.run(graph.ainvoke({"log": ["in"]}, config, durability="sync"))
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=first)
    worker.start()
    assert in_b.wait(30)
    head = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert head is not None and head.checkpoint["channel_values"]["log"] == ["in", "a"]
    _lose_checkpoint(dsn, thread, head.config["configurable"]["checkpoint_id"])
    release.set()
    worker.join(60)

    error = outcome.get("error")
    assert isinstance(error, DatabaseUnavailableError) and is_retryable(error), error
    assert "does not hold" in str(error) and "same run_id" in str(error)
    assert _missing_parents(dsn) == 0  # nothing was stored on the lost checkpoint
    # The retry continues from the surviving head: a runs again, the input is applied once.
    final = graph.invoke({"log": ["in"]}, run_config(thread, "run-1"), durability="sync")
    assert final["log"] == ["in", "a", "b"]
    assert _missing_parents(dsn) == 0


def test_a_write_after_a_lost_admission_is_not_a_concurrent_run_error(
    saver: DeterministicSaver, dsn: str
) -> None:
    """Run 1 finished; run 2's admission replaced its lease. The database then loses run
    2's admission and run 1's release (what an asynchronous standby may lack): the lease
    row is run 1's again, as it was. Run 2's next write meets "another run holds the
    thread", but no run took it over: a retryable DatabaseUnavailableError."""
    thread = "lost-admission"
    in_node, release = threading.Event(), threading.Event()

    def node(state: S) -> S:
        if state["log"][-1] == "in:run-2":
            in_node.set()
            assert release.wait(30)
        return {"log": ["node"]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    g.add_edge("node", END)
    graph = g.compile(checkpointer=saver)
    graph.invoke({"log": ["in:run-1"]}, run_config(thread, "run-1"), durability="sync")
    with psycopg.connect(dsn) as conn:
        before = conn.execute(
            "SELECT run_id, attempt, acquired_at FROM lgd_leases WHERE thread_id = %s", (thread,)
        ).fetchone()
    assert before is not None and before[0] == "run-1"
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            graph.invoke({"log": ["in:run-2"]}, run_config(thread, "run-2"), durability="sync")
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=second)
    worker.start()
    assert in_node.wait(30)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE lgd_leases SET run_id = %s, attempt = %s, acquired_at = %s, ended = NULL, "
            "outcome = 'free', expires_at = now() + interval '30 seconds' WHERE thread_id = %s",
            (*before, thread),
        )
    release.set()
    worker.join(60)
    error = outcome.get("error")
    assert isinstance(error, DatabaseUnavailableError) and is_retryable(error), error
    assert "admission" in str(error)


def _journaled_graph(saver: DeterministicSaver, during: Any) -> Any:
    calls: list[str] = []

    def pay() -> str:
        calls.append("pay")
        during()
        return "paid"

    def node(state: S) -> S:
        return {"log": [durable_sync("pay", pay)]}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    g.add_edge("node", END)
    return g.compile(checkpointer=saver), calls


def test_a_durable_op_whose_claim_was_lost_is_still_stored(
    saver: DeterministicSaver, dsn: str
) -> None:
    """The claim commits without waiting for the WAL flush, so a failover (even to a
    synchronous standby) can lose it while the op runs: the outcome is stored anyway, as
    long as the attempt still holds the thread - no ConcurrentRunError for a lone attempt."""
    thread = "lost-claim"

    def lose_claim() -> None:
        with psycopg.connect(dsn) as conn:
            deleted = conn.execute(
                "DELETE FROM lgd_journal WHERE thread_id = %s", (thread,)
            ).rowcount
        assert deleted == 1  # the op ran on a claim (claim_ahead=0)

    graph, calls = _journaled_graph(saver, lose_claim)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0))
    out = runner.invoke(graph, {"log": []}, run_config(thread, "run-1"), durability="sync")
    assert out == {"log": ["paid"]} and calls == ["pay"]
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT status, attempt FROM lgd_journal WHERE thread_id = %s", (thread,)
        ).fetchone()
    assert row == ("ok", runner.last_stats.attempt)
    # A retry replays it: the stored outcome is the op's.
    again = runner.invoke(graph, {"log": []}, run_config(thread, "run-1"), durability="sync")
    assert again == {"log": ["paid"]} and calls == ["pay"]


@pytest.mark.parametrize("claim_ahead", [0.0, 10.0])
def test_an_op_whose_attempt_registration_was_lost_gets_a_retryable_error(
    saver: DeterministicSaver, dsn: str, claim_ahead: float
) -> None:
    """The attempt's registration (its admission or first claim) is gone: the database
    cannot tell whether another attempt took over, so nothing is stored and the error is
    DatabaseUnavailableError; the retry runs the op again and finishes the run."""
    thread = f"lost-registration-{claim_ahead}"
    lost = threading.Event()

    def lose_registration() -> None:
        if lost.is_set():
            return
        lost.set()
        with psycopg.connect(dsn) as conn:
            conn.execute("DELETE FROM lgd_journal WHERE thread_id = %s", (thread,))
            conn.execute("DELETE FROM lgd_journal_attempts WHERE thread_id = %s", (thread,))

    graph, calls = _journaled_graph(saver, lose_registration)
    runner = DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=claim_ahead))
    with pytest.raises(DatabaseUnavailableError, match="registration") as caught:
        runner.invoke(graph, {"log": []}, run_config(thread, "run-1"), durability="sync")
    assert is_retryable(caught.value) and not isinstance(caught.value, ConcurrentRunError)
    with psycopg.connect(dsn) as conn:
        stored = conn.execute(
            "SELECT count(*) FROM lgd_journal WHERE thread_id = %s", (thread,)
        ).fetchone()
    assert stored == (0,)
    out = runner.invoke(graph, {"log": []}, run_config(thread, "run-1"), durability="sync")
    assert out == {"log": ["paid"]} and calls == ["pay", "pay"]


def test_a_write_on_a_server_that_takes_no_writes_is_retryable(dsn: str) -> None:
    """A connection that lands on a standby (or a server in recovery) gets
    ReadOnlySqlTransaction: a retryable DatabaseUnavailableError that names the DSN fix."""
    with DeterministicSaver(dsn) as setup:
        setup.setup()
    read_only = {"options": "-c default_transaction_read_only=on"}
    with DeterministicSaver(dsn, connect_kwargs=read_only) as saver:
        g = StateGraph(S)
        g.add_node("n", lambda s: {"log": ["n"]})
        g.add_edge(START, "n")
        graph = g.compile(checkpointer=saver)
        with pytest.raises(DatabaseUnavailableError, match="target_session_attrs") as caught:
            graph.invoke({"log": []}, run_config("read-only", "run-1"))
    assert is_retryable(caught.value)


@pytest.mark.parametrize(
    "raised",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CrashShutdown("terminating connection because of crash of another"),
        psycopg.errors.CannotConnectNow("the database system is in recovery mode"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_outage_is_a_retryable_database_unavailable_error(raised: Exception) -> None:
    translated = translate_error(raised)
    assert isinstance(translated, DatabaseUnavailableError), translated
    assert is_retryable(translated)


def test_other_database_errors_keep_their_type() -> None:
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert translate_error(deadlock) is deadlock


# -- with a real streaming replica ------------------------------------------------------


@pytest.fixture(scope="module")
def replica_available() -> None:
    from devtools.postgres import _find_binaries
    from langgraph_deterministic.errors import ConfigurationError

    try:
        bindir = _find_binaries()
    except ConfigurationError as exc:
        pytest.skip(f"no PostgreSQL server binaries for a replica: {exc}")
    if not (bindir / "pg_basebackup").is_file():
        pytest.skip(f"no pg_basebackup in {bindir}")


@pytest.mark.parametrize(("mode", "lag_ms"), [("sync", 0.0), ("async", 30.0)])
def test_runs_in_flight_finish_after_a_failover(
    replica_available: None, mode: str, lag_ms: float
) -> None:
    from devtools.failover import run_trial

    result = asyncio.run(
        run_trial(mode, journal=True, lag_ms=lag_ms, seed=7, durability="sync")  # type: ignore[arg-type]
    )
    detail = f"{result}"
    assert result.bad() == dict.fromkeys(result.bad(), 0), detail
    assert result.finished == result.runs == 12, detail
    # The failover hit runs in flight: some attempt saw the outage.
    assert result.errors.get("DatabaseUnavailableError", 0) >= 1, detail
    if mode == "sync":
        # Nothing acknowledged is lost: no op whose durable() returned runs again.
        assert result.ops_rerun_after_return == 0, detail
