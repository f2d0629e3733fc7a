"""A superstep's pending writes ride in its checkpoint's transaction (``_writebuffer``):
what becomes durable when, with parallel tasks, a failing sibling, an interrupt, and the
``buffer_writes`` window. The round-trip counts are in test_rows.py."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections import Counter
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_deterministic import DeterministicSaver, run_config


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


class Fanout:
    """START -> fast, slow (parallel). ``slow`` blocks until ``release`` is set, then
    returns, raises or interrupts (``mode``) the first time it runs."""

    def __init__(self, mode: str = "return") -> None:
        self.mode = mode
        self.fast_done = threading.Event()
        self.release = threading.Event()
        self.runs: Counter[str] = Counter()

    def fast(self, state: State) -> State:
        self.runs["fast"] += 1
        self.fast_done.set()
        return {"log": ["fast"]}

    def slow(self, state: State) -> State:
        self.runs["slow"] += 1
        assert self.release.wait(60), "the test never released slow"
        if self.runs["slow"] == 1 and self.mode == "raise":
            raise RuntimeError("slow failed")
        if self.mode == "interrupt":
            interrupt("approve?")
        return {"log": ["slow"]}

    def compile(self, saver: DeterministicSaver) -> Any:
        graph = StateGraph(State)
        graph.add_node("fast", self.fast)
        graph.add_node("slow", self.slow)
        graph.add_edge(START, "fast")
        graph.add_edge(START, "slow")
        return graph.compile(checkpointer=saver)


def fast_rows(db: str, thread_id: str) -> int:
    """Pending writes of ``fast`` stored for the thread (read by another session)."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM checkpoint_writes w WHERE w.thread_id = %s AND w.channel = "
            "'log' AND position('fast'::bytea in w.blob) > 0",
            (thread_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def start(
    graph: Any, inputs: Any, config: Any, is_async: bool
) -> tuple[threading.Thread, list[Any]]:
    """Run the graph in a thread (sync invoke, or ainvoke on its own loop)."""
    out: list[Any] = []

    def target() -> None:
        try:
            if is_async:
                out.append(asyncio.run(graph.ainvoke(inputs, config, durability="sync")))
            else:
                out.append(graph.invoke(inputs, config, durability="sync"))
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def wait_for(predicate: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_finished_sibling_is_durable_within_the_window(db: str, is_async: bool) -> None:
    """fast finished, slow still runs: fast's writes are stored on their own once they
    have waited buffer_writes seconds, before the superstep ends."""
    fan = Fanout()
    thread_id = f"window-{is_async}"
    with DeterministicSaver(db, buffer_writes=0.05) as saver:
        graph = fan.compile(saver)
        worker, out = start(graph, {"log": []}, run_config(thread_id, "r1"), is_async)
        assert fan.fast_done.wait(30)
        assert wait_for(lambda: fast_rows(db, thread_id) == 1), "fast's writes never stored"
        assert not fan.release.is_set() and worker.is_alive()  # the superstep is not over
        fan.release.set()
        worker.join(60)
    assert sorted(out[0]["log"]) == ["fast", "slow"]
    assert fast_rows(db, thread_id) == 1


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_writes_wait_for_the_checkpoint_and_land_with_it(db: str, is_async: bool) -> None:
    """With a long window, fast's writes are not stored while slow runs: they go out in
    the transaction of the checkpoint that ends the superstep."""
    fan = Fanout()
    thread_id = f"fold-{is_async}"
    with DeterministicSaver(db, buffer_writes=30) as saver:
        graph = fan.compile(saver)
        worker, out = start(graph, {"log": []}, run_config(thread_id, "r1"), is_async)
        assert fan.fast_done.wait(30)
        time.sleep(0.3)  # fast's put_writes has been made by now (it is waiting)
        assert fast_rows(db, thread_id) == 0
        fan.release.set()
        worker.join(60)
    assert sorted(out[0]["log"]) == ["fast", "slow"]
    assert fast_rows(db, thread_id) == 1


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_failing_sibling_stores_the_finished_ones_and_a_retry_skips_them(
    db: str, is_async: bool
) -> None:
    """slow raises after fast finished: fast's waiting writes are stored with slow's
    error, so the retry (same run id) runs only slow."""
    fan = Fanout("raise")
    thread_id = f"fail-{is_async}"
    with DeterministicSaver(db, buffer_writes=30) as saver:
        graph = fan.compile(saver)
        worker, out = start(graph, {"log": []}, run_config(thread_id, "r1"), is_async)
        assert fan.fast_done.wait(30)
        fan.release.set()
        worker.join(60)
        assert isinstance(out[0], RuntimeError)
        assert fast_rows(db, thread_id) == 1
        worker, out = start(graph, {"log": []}, run_config(thread_id, "r1"), is_async)
        worker.join(60)
    assert sorted(out[0]["log"]) == ["fast", "slow"]
    assert fan.runs == {"fast": 1, "slow": 2}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_interrupt_keeps_the_finished_sibling(db: str, is_async: bool) -> None:
    """slow interrupts after fast finished: the run returns with fast's writes stored
    (the interrupt's write carries them); the resume runs slow only."""
    fan = Fanout("interrupt")
    thread_id = f"interrupt-{is_async}"
    with DeterministicSaver(db, buffer_writes=30) as saver:
        graph = fan.compile(saver)
        fan.release.set()
        worker, out = start(graph, {"log": []}, run_config(thread_id, "r1"), is_async)
        worker.join(60)
        assert "__interrupt__" in out[0]
        assert fast_rows(db, thread_id) == 1
        state = graph.get_state({"configurable": {"thread_id": thread_id}})
        assert [t.name for t in state.tasks if t.interrupts] == ["slow"]
        worker, out = start(graph, Command(resume="yes"), run_config(thread_id, "r2"), is_async)
        worker.join(60)
    assert sorted(out[0]["log"]) == ["fast", "slow"]
    assert fan.runs == {"fast": 1, "slow": 2}


def test_a_stream_left_mid_superstep_stores_its_writes_when_it_closes(db: str) -> None:
    """The caller stops reading after fast's update: the run ends (GeneratorExit), and
    the release stores fast's waiting writes; the retry runs slow only."""
    fan = Fanout()
    fan.release.set()
    thread_id = "stream-left"
    with DeterministicSaver(db, buffer_writes=30) as saver:
        graph = fan.compile(saver)
        stream = graph.stream({"log": []}, run_config(thread_id, "r1"), durability="sync")
        first = next(iter(stream))
        stream.close()
        ran = next(iter(first))
        assert ran in ("fast", "slow")
        out = graph.invoke({"log": []}, run_config(thread_id, "r1"), durability="sync")
    assert sorted(out["log"]) == ["fast", "slow"]
    assert fan.runs[ran] == 1


def test_buffer_writes_is_checked(db: str) -> None:
    from langgraph_deterministic.errors import ConfigurationError

    for wrong in (-1, 61, float("nan")):
        with pytest.raises(ConfigurationError, match="buffer_writes"):
            DeterministicSaver(db, buffer_writes=wrong)


def test_a_read_drops_a_fenced_attempts_leftover_writes_and_raises_anything_else(
    db: str,
) -> None:
    """Before a read, the writes still waiting on the thread are stored. When the guard
    refuses them (their attempt was fenced meanwhile: LG410/LG413), the read goes on
    without them; any other failure is the read's own and propagates."""
    from langgraph_deterministic._db.batch import Statement
    from langgraph_deterministic.checkpointer._writebuffer import store_leftovers

    refuse = "SELECT lgd_refuse_v6(%(code)s, 'fenced', '')"
    with DeterministicSaver(db) as saver:
        for code in ("LG410", "LG413"):
            assert saver._run(store_leftovers([Statement(refuse, {"code": code})])) is None
        with pytest.raises(Exception) as raised:
            saver._run(store_leftovers([Statement("SELECT 1 / 0")]))
        assert "division by zero" in str(raised.value)
