"""DeterministicSaver as the checkpointer of a graph DeterministicRunner drives, with a crash
at every durable event of a turn (the in-memory journal of fake_journal.py, which enforces
Restate's replay rules), then retries until the turn succeeds.

Whatever the crash point, including between the commit's Postgres transaction and the
journal recording it: no journal mismatch, the commit stored once, and the thread's state,
history and run ledger equal those of the same turns run without the runner.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from langgraph_deterministic import DeterministicSaver, ThreadBusyError, run_config
from langgraph_deterministic.runner import DeterministicRunner
from langgraph_deterministic.runner._checkpointer import COMMIT_OP, START_OP

from . import restate_app
from .fake_journal import Crash, FakeAttempt, FakeJournal, Store

TURNS: list[dict[str, Any]] = [
    {"turn": 1, "topic": "tides"},
    {"turn": 2, "resume": "yes"},
    {"turn": 3, "topic": "moons"},
]


async def _facts(saver: DeterministicSaver, thread: str) -> dict[str, Any]:
    graph = restate_app.hitl_graph(saver)
    history = [
        (s.metadata.get("step") if s.metadata else None, s.next, s.values,
         sorted((t.name, [i.value for i in t.interrupts]) for t in s.tasks))
        async for s in graph.aget_state_history({"configurable": {"thread_id": thread}})
    ]
    runs = {}
    for spec in TURNS:
        rec = await saver.aget_run(thread, f"{thread}:turn{spec['turn']}")
        runs[spec["turn"]] = None if rec is None else (rec.status, rec.attempts)
    return {"history": history, "runs": runs}


async def _turn(saver: DeterministicSaver, thread: str, spec: dict[str, Any], effects: Path,
                crash_after: int | None) -> tuple[dict[str, Any], Store, int]:
    """One invocation: attempts against one journal until one succeeds."""
    req = {**spec, "effects": str(effects), "gate": None}
    restate_app._REQ["current"] = req
    graph = restate_app.hitl_graph(saver)
    store, attempts = Store(), 0
    while True:
        attempts += 1
        attempt = FakeAttempt(store, io_ticks=lambda _n: 1, crash_after=crash_after)
        crash_after = None
        runner = DeterministicRunner(journal=FakeJournal(attempt))
        try:
            cfg = run_config(thread, f"{thread}:turn{spec['turn']}")
            out = await runner.ainvoke(graph, restate_app.hitl_input(req), cfg)
        except Crash:
            continue
        return restate_app.hitl_output(out), store, attempts


@pytest.fixture(scope="module")
async def saver(dsn: str) -> Any:
    async with DeterministicSaver(dsn) as s:
        await s.asetup()
        yield s


@pytest.fixture(scope="module")
async def reference(saver: DeterministicSaver, tmp_path_factory: Any) -> dict[str, Any]:
    thread = f"ref-{uuid.uuid4().hex[:8]}"
    effects = tmp_path_factory.mktemp("ref") / "effects.log"
    graph = restate_app.hitl_graph(saver)
    outs = []
    for spec in TURNS:
        req = {**spec, "effects": str(effects), "gate": None}
        restate_app._REQ["current"] = req
        cfg = run_config(thread, f"{thread}:turn{spec['turn']}")
        outs.append(restate_app.hitl_output(await graph.ainvoke(restate_app.hitl_input(req), cfg)))
    return {"outs": outs, **(await _facts(saver, thread))}


@pytest.mark.parametrize("crash_turn", [1, 2, 3])
async def test_crash_at_every_event_of_a_turn(
    saver: DeterministicSaver, reference: dict[str, Any], crash_turn: int, tmp_path: Path
) -> None:
    # How many durable events the turn has when nothing crashes.
    probe_thread = f"probe-{uuid.uuid4().hex[:8]}"
    events = 0
    for spec in TURNS[:crash_turn]:
        _, store, _ = await _turn(saver, probe_thread, spec, tmp_path / "probe.log", None)
        events = len(store.commands) + len(store.results)
    assert events > 10
    crashes = 0
    for crash_after in range(events):
        thread = f"crash-{crash_turn}-{crash_after}-{uuid.uuid4().hex[:6]}"
        outs = []
        for spec in TURNS:
            out, store, attempts = await _turn(
                saver, thread, spec, tmp_path / "effects.log",
                crash_after if spec["turn"] == crash_turn else None,
            )
            outs.append(out)
            if spec["turn"] == crash_turn:
                # (the batching of decisions, so the event count, varies with timing)
                assert attempts in (1, 2), (crash_after, attempts)
                crashes += attempts == 2
        for got, want in zip(outs, reference["outs"], strict=True):
            assert got["results"] == want["results"] and got["summary"] == want["summary"]
        facts = await _facts(saver, thread)
        assert facts["history"] == reference["history"], crash_after
        assert facts["runs"] == reference["runs"], crash_after
    assert crashes >= events - 5


class CrashAtCommit(FakeAttempt):
    """Dies right after the commit's transaction, before the journal records it."""

    async def _execute(self, idx: int) -> None:
        if self.specs[idx][0] == f"run/{COMMIT_OP}#0" and self.crash_after is None:
            self.crash_after = self.events  # the next durable event (its record) crashes
        await super()._execute(idx)


@pytest.mark.parametrize("crash_turn", [1, 2, 3])
async def test_crash_between_commit_and_its_record(
    saver: DeterministicSaver, reference: dict[str, Any], crash_turn: int, tmp_path: Path
) -> None:
    thread = f"commit-{crash_turn}-{uuid.uuid4().hex[:6]}"
    for spec in TURNS:
        req = {**spec, "effects": str(tmp_path / "effects.log"), "gate": None}
        restate_app._REQ["current"] = req
        graph = restate_app.hitl_graph(saver)
        cfg = run_config(thread, f"{thread}:turn{spec['turn']}")
        store = Store()
        if spec["turn"] == crash_turn:
            attempt: FakeAttempt = CrashAtCommit(store, io_ticks=lambda _n: 1)
            with pytest.raises(Crash):
                await DeterministicRunner(journal=FakeJournal(attempt)).ainvoke(
                    graph, restate_app.hitl_input(req), cfg)
        runner = DeterministicRunner(journal=FakeJournal(FakeAttempt(store, io_ticks=lambda _n: 1)))
        out = restate_app.hitl_output(await runner.ainvoke(graph, restate_app.hitl_input(req), cfg))
        want = reference["outs"][spec["turn"] - 1]
        assert out["results"] == want["results"] and out["summary"] == want["summary"]
        if spec["turn"] == crash_turn:
            assert store.executions[f"run/{COMMIT_OP}#0"] == 2  # ran again, stored nothing twice
    facts = await _facts(saver, thread)
    assert facts["history"] == reference["history"]
    assert facts["runs"] == reference["runs"]


class CrashAtOp(FakeAttempt):
    """Dies when the run asks for the first new durable op whose key matches ``at``:
    the graph call of this attempt raises, as a suspended or killed Restate attempt's does."""

    def __init__(self, store: Store, at: Any) -> None:
        super().__init__(store, io_ticks=lambda _n: 1)
        self.at = at

    def start_op(self, key: str, spec: Any) -> int:
        if not self.is_replaying() and self.at(key):
            self.crashed = True
            raise Crash()
        return super().start_op(key, spec)


async def _lease(dsn: str, thread: str) -> tuple[str, str | None, bool]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT run_id, ended, expires_at > now() FROM lgd_leases WHERE thread_id = %s",
            (thread,),
        )
        row = await cur.fetchone()
    assert row is not None
    return row[0], row[1], row[2]


async def test_the_lease_is_the_runs_not_an_attempts(
    saver: DeterministicSaver, reference: dict[str, Any], dsn: str, tmp_path: Path
) -> None:
    """A journaled run holds its thread from its start op to its commit, whatever its
    attempts do: an attempt whose graph call raises (suspended, killed) does not end the
    run as 'error', a replay (which never admits again) still holds it, and the commit
    releases it as 'ok' in its transaction, so the next turn is admitted."""
    thread = f"lease-{uuid.uuid4().hex[:8]}"
    effects = tmp_path / "effects.log"
    graph = restate_app.hitl_graph(saver)
    outs = []
    for spec in TURNS:
        req = {**spec, "effects": str(effects), "gate": None}
        restate_app._REQ["current"] = req
        run = f"{thread}:turn{spec['turn']}"
        store = Store()
        if spec["turn"] == 2:  # a turn that ends by returning (not at an interrupt)
            # Attempt 1 dies in a node, after the start op admitted the run.
            with pytest.raises(Crash):
                await DeterministicRunner(journal=FakeJournal(CrashAtOp(
                    store, lambda k: START_OP not in k))).ainvoke(
                        graph, restate_app.hitl_input(req), run_config(thread, run))
            assert await _lease(dsn, thread) == (run, None, True)
            # Attempt 2 replays, the graph returns, and it dies before the commit.
            with pytest.raises(Crash):
                await DeterministicRunner(journal=FakeJournal(CrashAtOp(
                    store, lambda k: COMMIT_OP in k))).ainvoke(
                        graph, restate_app.hitl_input(req), run_config(thread, run))
            assert await _lease(dsn, thread) == (run, None, True)
            # The run is in flight: another run is refused, with nothing written.
            before = await graph.aget_state({"configurable": {"thread_id": thread}})
            with pytest.raises(ThreadBusyError):
                await graph.ainvoke(restate_app.hitl_input({**TURNS[2], "effects": str(effects),
                                                            "gate": None}),
                                    run_config(thread, f"{thread}:other"))
            after = await graph.aget_state({"configurable": {"thread_id": thread}})
            assert after.config == before.config
        runner = DeterministicRunner(journal=FakeJournal(FakeAttempt(store, io_ticks=lambda _n: 1)))
        out = await runner.ainvoke(graph, restate_app.hitl_input(req), run_config(thread, run))
        outs.append(restate_app.hitl_output(out))
        got_run, ended, _ = await _lease(dsn, thread)
        assert (got_run, ended) == (run, "ok")  # released by the commit
    for got, want in zip(outs, reference["outs"], strict=True):
        assert got["results"] == want["results"] and got["summary"] == want["summary"]
    facts = await _facts(saver, thread)
    assert facts["history"] == reference["history"]
    assert facts["runs"] == reference["runs"]


async def test_astream_commits_when_the_stream_ends(
    saver: DeterministicSaver, tmp_path: Path
) -> None:
    thread = f"stream-{uuid.uuid4().hex[:8]}"
    req = {**TURNS[0], "effects": str(tmp_path / "effects.log"), "gate": None}
    restate_app._REQ["current"] = req
    graph = restate_app.hitl_graph(saver)
    runner = DeterministicRunner(journal=FakeJournal(FakeAttempt(Store(), io_ticks=lambda _n: 1)))
    cfg = run_config(thread, f"{thread}:turn1")
    chunks = [c async for c in runner.astream(graph, restate_app.hitl_input(req), cfg,
                                               stream_mode="updates")]
    assert any("__interrupt__" in c for c in chunks)
    state = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert state.next == ("approve",)
    assert len(state.values["results"]) == 5


@pytest.mark.parametrize("durability", ["async", "sync", "exit"])
async def test_an_interrupted_run_reads_interrupted_after_its_one_commit(
    saver: DeterministicSaver, durability: str
) -> None:
    """The journal's commit stores a run's writes in the order LangGraph made them: under
    durability "async" the interrupt's write can come before the put that creates the run's
    ledger row (a resume's batch starts with the Command's writes). In one transaction the
    row still ends ``interrupted`` at the interrupted checkpoint, as a direct call's does
    (tests/contract/test_rows.py)."""
    from tests.contract.test_rows import ASYNC_INTERRUPT_TURNS, build_asking

    graph = build_asking(asynchronous=True).compile(checkpointer=saver)
    for i in range(4):
        thread = f"int-{durability}-{i}-{uuid.uuid4().hex[:6]}"
        for run, given in ASYNC_INTERRUPT_TURNS:
            runner = DeterministicRunner(
                journal=FakeJournal(FakeAttempt(Store(), io_ticks=lambda _n: 1)))
            out = await runner.ainvoke(graph, given, run_config(thread, run),
                                       durability=durability)  # fmt: skip
            assert "__interrupt__" in out
            head = await saver.aget_tuple({"configurable": {"thread_id": thread}})
            record = await saver.aget_run(thread, run)
            assert head is not None and record is not None
            assert (record.status, record.last_checkpoint_id) == (
                "interrupted", head.config["configurable"]["checkpoint_id"]), (thread, run)
