"""Crashes and races across real OS processes: Postgres is the only thing they share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests.contract.graphs import ask, build_pipeline, effects, wait_for_effect

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config

WORKER = ["-m", "tests.contract._worker"]
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    """A failed test must not leave a paused worker behind: kill this test's survivors."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


ROOT_NODES = ("plan", "gather", "digest", "section", "write")


def start_worker(
    db: str,
    thread: str,
    run: str,
    tmp_path: Path,
    pause_at: str | None = None,
    text: str = "write the report",
) -> tuple[subprocess.Popen[str], Path]:
    release = tmp_path / f"release-{thread}-{run}-{os.urandom(4).hex()}"
    env = {**os.environ, "LGD_RELEASE": str(release)}
    env.pop("LGD_PAUSE_AT", None)
    if pause_at:
        env["LGD_PAUSE_AT"] = pause_at
    proc = subprocess.Popen(
        [sys.executable, *WORKER, db, thread, run, text],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc, release


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def root_history(db: str, thread: str) -> list[tuple[str, str | None, str | None]]:
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id, metadata ->> 'run_id' FROM checkpoints "
            "WHERE thread_id = %s AND checkpoint_ns = '' ORDER BY checkpoint_id",
            (thread,),
        ).fetchall()


def assert_linear(db: str, thread: str) -> None:
    """Every namespace of the thread is one chain: no checkpoint has two children."""
    with psycopg.connect(db) as conn:
        forks = conn.execute(
            "SELECT checkpoint_ns, parent_checkpoint_id, count(*) FROM checkpoints "
            "WHERE thread_id = %s AND parent_checkpoint_id IS NOT NULL "
            "GROUP BY 1, 2 HAVING count(*) > 1",
            (thread,),
        ).fetchall()
        roots = conn.execute(
            "SELECT checkpoint_ns, count(*) FROM checkpoints "
            "WHERE thread_id = %s AND parent_checkpoint_id IS NULL GROUP BY 1 HAVING count(*) > 1",
            (thread,),
        ).fetchall()
    assert forks == [] and roots == [], (forks, roots)


def test_sigkill_mid_node_then_retry_from_another_process(db: str, tmp_path: Path) -> None:
    thread = "sigkill"
    proc, _ = start_worker(db, thread, "job-1", tmp_path, pause_at="section")
    wait_for_effect(db, thread, "paused:section", procs=[proc])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = effects(db, thread)
    assert "done:digest" in before and "done:write" not in before

    retry, _ = start_worker(db, thread, "job-1", tmp_path)
    code, out, err = finish(retry)
    assert code == 0, err
    assert out.strip() == "report of 7 steps"
    done = Counter(e for e in effects(db, thread) if e.startswith("done:"))
    # Every node that had finished before the kill ran exactly once overall; the sections
    # that the kill interrupted ran again (at most once more each).
    assert done["done:plan"] == done["done:gather"] == done["done:digest"] == 1
    assert done["done:section"] == 3 and done["done:write"] == 1
    with DeterministicSaver(db) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        state = graph.get_state({"configurable": {"thread_id": thread}})
        humans = [m for m in state.values["messages"] if m.type == "human"]
        assert len(humans) == 1  # the input was applied once
        run = saver.get_run(thread, "job-1")
        assert run is not None and run.attempts == 2
    assert_linear(db, thread)


@pytest.mark.parametrize("thread", ["race", "race-on-a-new-thread"])
def test_two_processes_racing_on_one_run(db: str, tmp_path: Path, thread: str) -> None:
    # "race": a previous run, so both attempts load the same head and apply the same input.
    # On a new thread an attempt that loads nothing gets no attempt token from a loaded
    # checkpoint: its writes are told apart from the other attempt's by the one-child
    # slots alone (whichever interleaving the two processes' start-up gives).
    warm = thread == "race"
    # The checkpoints one run of the graph writes: on this thread, or on a new one alike.
    reference = thread if warm else f"{thread}-reference"
    with DeterministicSaver(db) as saver:
        build_pipeline(db).compile(checkpointer=saver).invoke(
            ask("warm up"), run_config(reference, "job-0"), durability="sync"
        )
    one_run = Counter(run for _, _, run in root_history(db, reference))["job-0"]
    first, release = start_worker(db, thread, "job-1", tmp_path, pause_at="plan")
    second, release2 = start_worker(db, thread, "job-1", tmp_path, pause_at="plan")
    # Both load the same head. Each pauses in "plan" -- unless it lost at its very first
    # write (the input checkpoint) before reaching it, which is the race resolved early.
    deadline = time.monotonic() + 90
    while (
        effects(db, thread).count("paused:plan")
        + sum(p.poll() is not None for p in (first, second))
        < 2
    ):
        assert time.monotonic() < deadline, effects(db, thread)
        time.sleep(0.05)
    release.touch()
    release2.touch()
    results = sorted([finish(first)[0], finish(second)[0]])
    assert results == [0, 3]  # one attempt wins, the other gets ConcurrentRunError
    assert_linear(db, thread)
    history = root_history(db, thread)
    per_run = Counter(run for _, _, run in history)
    # The winner's chain only: as many checkpoints as one run of the same graph writes.
    assert per_run["job-1"] == one_run
    with DeterministicSaver(db) as saver:
        state = (
            build_pipeline(db)
            .compile(checkpointer=saver)
            .get_state({"configurable": {"thread_id": thread}})
        )
    assert [m.content for m in state.values["messages"] if m.type == "human"] == [
        *(["warm up"] if warm else []),
        "write the report",
    ]
    assert state.next == ()


def test_zombie_of_run_a_wakes_after_run_c_finished(db: str, tmp_path: Path) -> None:
    thread = "zombie"
    zombie, release = start_worker(db, thread, "job-A", tmp_path, pause_at="section")
    wait_for_effect(db, thread, "paused:section", procs=[zombie])
    with DeterministicSaver(db) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        # The orchestrator gave up on the silent worker and retried A elsewhere...
        graph.invoke(ask("write the report"), run_config(thread, "job-A"), durability="sync")
        # ...and a later run C finished.
        c_out = graph.invoke(ask("and an appendix"), run_config(thread, "job-C"), durability="sync")
        head_before = graph.get_state({"configurable": {"thread_id": thread}})
        checkpoints_before = root_history(db, thread)
        release.touch()  # the zombie wakes up
        code, _, err = finish(zombie)
        assert code == 3, err
        assert "ConcurrentRunError" in err
        head_after = graph.get_state({"configurable": {"thread_id": thread}})
        assert head_after.config == head_before.config
        assert head_after.values == head_before.values == c_out
        assert root_history(db, thread) == checkpoints_before  # nothing of the zombie stored
        run_a = saver.get_run(thread, "job-A")
        assert run_a is not None and run_a.status == "done"
    assert_linear(db, thread)
