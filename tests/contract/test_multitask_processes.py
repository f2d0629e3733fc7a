"""Runs on one thread across real OS processes: 20 runs started at once under each
multitask strategy, and a worker SIGKILLed inside a tool step. Postgres is the only thing
the processes share."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.contract.graphs import ask, build_agent, build_chat, effects, wait_for_effect
from tests.contract.test_processes import assert_linear, root_history

from langgraph_deterministic import (
    DeterministicSaver,
    RunUnfinishedError,
    ThreadBusyError,
    run_config,
)

WORKER = ["-m", "tests.contract._worker"]
N = 20
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def spawn(
    db: str, thread: str, run: str, text: str, tmp_path: Path, **env: str
) -> subprocess.Popen[str]:
    full = {**os.environ, "LGD_RELEASE": str(tmp_path / f"release-{thread}"), **env}
    for key in ("LGD_PAUSE_AT",):
        if key not in env:
            full.pop(key, None)
    proc = subprocess.Popen(
        [sys.executable, *WORKER, db, thread, run, text],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc


PROCESSES = 4


def start_many(db: str, thread: str, tmp_path: Path, **env: str) -> list[subprocess.Popen[str]]:
    """N runs in PROCESSES processes (N / PROCESSES threads each: starting 20 Python
    processes would cost more than the test), all calling the graph at the same moment
    (a start file)."""
    start = tmp_path / f"start-{thread}"
    procs = []
    for p in range(PROCESSES):
        ids = range(p, N, PROCESSES)
        runs = ",".join(f"run-{i:02d}" for i in ids)
        texts = ",".join(f"msg-{i:02d}" for i in ids)
        procs.append(spawn(db, thread, runs, texts, tmp_path, LGD_START=str(start), **env))
    time.sleep(0.1)
    start.touch()
    return procs


def results(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """(exit code, output, error) of every run, in run order."""
    found: dict[str, tuple[int, str, str]] = {}
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        for line in out.splitlines():
            run, code, text = line.split(" ", 2)
            found[run] = (int(code), text if code == "0" else "", text if code != "0" else "")
    assert len(found) == N, found
    return [found[f"run-{i:02d}"] for i in range(N)]


def ledger(db: str, thread: str) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, status, multitask_outcome FROM lgd_runs WHERE thread_id = %s",
            (thread,),
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def humans(db: str, thread: str) -> list[str]:
    with DeterministicSaver(db) as saver:
        state = (
            build_chat(db)
            .compile(checkpointer=saver)
            .get_state({"configurable": {"thread_id": thread}})
        )
    return [m.content for m in state.values.get("messages", []) if m.type == "human"]


def follow_up(db: str, thread: str) -> None:
    with DeterministicSaver(db) as saver:
        out = (
            build_chat(db)
            .compile(checkpointer=saver)
            .invoke(ask("after"), run_config(thread, "follow-up"), durability="sync")
        )
    assert out["messages"][-1].content == "re: after"
    assert_linear(db, thread)


def test_reject_one_runs_nineteen_are_refused_with_nothing_written(db: str, tmp_path: Path) -> None:
    thread = "mt-reject"
    procs = start_many(db, thread, tmp_path, LGD_GRAPH="chat", LGD_PAUSE_AT="reply")
    # The winner pauses inside its node, holding the lease, until the others are done.
    wait_for_effect(db, thread, "paused:reply", timeout=180)
    # The 19 others are refused at once (no wait): give them time to finish, then release.
    deadline = time.monotonic() + 180
    while sum(p.poll() is not None for p in procs) < PROCESSES - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / f"release-{thread}").touch()
    codes = [code for code, _, _ in results(procs)]
    assert Counter(codes) == {0: 1, 5: N - 1}, codes
    winner = f"run-{codes.index(0):02d}"
    # Nothing of the refused runs was written: no checkpoint, no ledger row, no effect.
    assert {run for _, _, run in root_history(db, thread)} == {winner}
    assert set(ledger(db, thread)) == {winner}
    assert effects(db, thread).count("start:reply") == 1
    assert humans(db, thread) == [f"msg-{codes.index(0):02d}"]
    follow_up(db, thread)


def test_enqueue_all_finish_one_after_another(db: str, tmp_path: Path) -> None:
    thread = "mt-enqueue"
    procs = start_many(
        db, thread, tmp_path, LGD_GRAPH="chat", LGD_STRATEGY="enqueue", LGD_SLEEP="0.1"
    )
    outcome = results(procs)
    assert [code for code, _, _ in outcome] == [0] * N, [e for c, _, e in outcome if c]
    # Each input applied exactly once, each run answered its own message.
    assert sorted(humans(db, thread)) == sorted(f"msg-{i:02d}" for i in range(N))
    assert [o for _, o, _ in outcome] == [f"re: msg-{i:02d}" for i in range(N)]
    # One after another: no two replies overlapped.
    events = [e for e in effects(db, thread) if e.startswith(("start:reply", "done:reply"))]
    assert events == [e for pair in zip(events[::2], events[1::2], strict=True) for e in pair]
    assert all(
        a == "start:reply" and b.startswith("done:reply")
        for a, b in zip(events[::2], events[1::2], strict=True)
    )
    runs = ledger(db, thread)
    assert all(status in ("running", "done") for status, _ in runs.values())
    assert Counter(o for _, o in runs.values())["enqueued"] >= 1  # most waited in the queue
    with psycopg.connect(db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM lgd_queue WHERE thread_id = %s", (thread,)
        ).fetchone() == (0,)
    assert_linear(db, thread)
    follow_up(db, thread)


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_interrupt_and_rollback_leave_a_usable_linear_thread(
    db: str, tmp_path: Path, strategy: str
) -> None:
    thread = f"mt-{strategy}"
    procs = start_many(
        db, thread, tmp_path, LGD_GRAPH="chat", LGD_STRATEGY=strategy, LGD_SLEEP="0.3"
    )
    outcome = results(procs)
    codes = [code for code, _, _ in outcome]
    # Each run either finished or was stopped at its next write by a later run.
    assert set(codes) <= {0, 3} and 0 in codes, [e for c, _, e in outcome if c not in (0, 3)]
    # A stopped run is fenced at its next write: by the lease the later run took (LG413),
    # or, when its buffered pending writes reach Postgres with that put after the later
    # run continued their checkpoint, by the chain (LG410). Both are ConcurrentRunError.
    fenced = ("took the thread over", "Another attempt has moved thread")
    stopped_why = [e for c, _, e in outcome if c == 3]
    assert all(any(f in e for f in fenced) for e in stopped_why), stopped_why
    runs = ledger(db, thread)
    stopped = {f"run-{i:02d}" for i, c in enumerate(codes) if c == 3}
    kept = humans(db, thread)
    assert len(kept) == len(set(kept))  # no input applied twice
    if strategy == "interrupt":
        # The interrupted runs keep their progress: their input stays in the history.
        assert all(runs[r][0] == "superseded" for r in stopped if r in runs)
        assert {f"msg-{i:02d}" for i, c in enumerate(codes) if c == 0} <= set(kept)
    else:
        # A rolled-back run's checkpoints are gone (a run stopped before its first write
        # had none): the history holds exactly the inputs of the runs that were not.
        in_history = {run for _, _, run in root_history(db, thread)}
        gone = {r for r, (status, _) in runs.items() if status == "rolled_back"}
        assert not (stopped | gone) & in_history
        assert set(kept) == {f"msg-{r[4:]}" for r in in_history}
    assert any(o and o.startswith(("interrupted", "rolled back")) for _, o in runs.values())
    assert_linear(db, thread)
    follow_up(db, thread)


# --- a worker SIGKILLed inside a tool step ------------------------------------------------

TTL = 3.0


def kill_in_tool(
    db: str, thread: str, run: str, text: str, tmp_path: Path, ttl: float = TTL
) -> None:
    proc = spawn(
        db,
        thread,
        run,
        text,
        tmp_path,
        LGD_GRAPH="agent",
        LGD_PAUSE_AT="tools",
        LGD_LEASE_TTL=str(ttl),
    )
    wait_for_effect(db, thread, "paused:tools", procs=[proc], timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_expiry(saver: DeterministicSaver, thread: str, run: str) -> None:
    """Until the dead worker's lease has expired (read from the ledger, no guessed sleep)."""
    deadline = time.monotonic() + 60
    while True:
        record = saver.get_run(thread, run)
        assert record is not None and record.lease is not None
        if record.lease.expires_at <= dt.datetime.now(dt.UTC):
            return
        assert time.monotonic() < deadline
        time.sleep(0.1)


def agent(saver: DeterministicSaver, db: str) -> Any:
    return build_agent(db).compile(checkpointer=saver)


def test_sigkill_in_a_tool_then_a_new_run_before_and_after_expiry(db: str, tmp_path: Path) -> None:
    thread = "mt-crash-new"
    kill_in_tool(db, thread, "c1", "weather?", tmp_path)
    with DeterministicSaver(db, lease_ttl=TTL) as saver:
        graph = agent(saver, db)
        record = saver.get_run(thread, "c1")
        assert record is not None and record.lease is not None and record.lease.ended is None
        assert record.multitask_strategy == "reject" and record.multitask_outcome == "free"
        before = root_history(db, thread)
        # (a) before the lease expires: the thread is busy.
        if record.lease.expires_at > dt.datetime.now(dt.UTC):
            with pytest.raises(ThreadBusyError, match="'c1'"):
                graph.invoke(ask("news?"), run_config(thread, "c2"), durability="sync")
            assert root_history(db, thread) == before
        wait_for_expiry(saver, thread, "c1")
        # (c) after expiry: c1 is unfinished; a new input is refused by default...
        with pytest.raises(RunUnfinishedError) as refused:
            graph.invoke(ask("news?"), run_config(thread, "c2"), durability="sync")
        message = str(refused.value)
        assert "'c1'" in message and "rollback" in message and "audit" in message
        assert root_history(db, thread) == before
        # ...and succeeds with rollback: c1's half-done step is removed, the strict model
        # (which rejects unanswered tool calls) is happy.
        out = graph.invoke(
            ask("news?"), run_config(thread, "c2", multitask_strategy="rollback"), durability="sync"
        )
        assert out["messages"][-1].content == "answer: found news?"
        assert [m.content for m in out["messages"] if m.type == "human"] == ["news?"]
        c1 = saver.get_run(thread, "c1")
        assert c1 is not None and c1.status == "rolled_back" and c1.superseded_by == "c2"
        c2 = saver.get_run(thread, "c2")
        assert c2 is not None and c2.multitask_outcome == "rolled back c1"
        assert c2.lease is not None and c2.lease.ended == "ok"
    assert_linear(db, thread)


def test_sigkill_in_a_tool_then_a_new_run_while_the_lease_lives(db: str, tmp_path: Path) -> None:
    """(a) on its own, unconditionally: with a lease far longer than the test takes, the
    dead worker's thread is busy for a new run, which writes nothing (the test above checks
    (a) only when its short lease is still alive by the time the saver is up)."""
    thread = "mt-crash-busy"
    kill_in_tool(db, thread, "c1", "weather?", tmp_path, ttl=600)
    with DeterministicSaver(db, lease_ttl=600) as saver:
        before = root_history(db, thread)
        with pytest.raises(ThreadBusyError, match="'c1'"):
            agent(saver, db).invoke(ask("news?"), run_config(thread, "c2"), durability="sync")
        assert root_history(db, thread) == before
        assert saver.get_run(thread, "c2") is None
        record = saver.get_run(thread, "c1")
        assert record is not None and record.lease is not None and record.lease.ended is None


def test_sigkill_in_a_tool_then_the_retry_resumes_after_expiry(db: str, tmp_path: Path) -> None:
    thread = "mt-crash-retry"
    kill_in_tool(db, thread, "c1", "weather?", tmp_path)
    with DeterministicSaver(db, lease_ttl=TTL) as saver:
        wait_for_expiry(saver, thread, "c1")
        # (b) the retry of the same run takes the expired lease over and resumes.
        out = agent(saver, db).invoke(ask("weather?"), run_config(thread, "c1"), durability="sync")
        assert out["messages"][-1].content == "answer: found weather?"
        assert [m.content for m in out["messages"] if m.type == "human"] == ["weather?"]
        record = saver.get_run(thread, "c1")
        assert record is not None and record.attempts == 2 and record.multitask_outcome == "retry"
        # The model ran once before the crash: only the tool step ran again.
        assert effects(db, thread).count("start:tool:call-1") == 2
    assert_linear(db, thread)
