"""Property tests of the ordering core, without Restate.

For any program of concurrent tasks (non-durable work of random length, durable ops one at
a time or several at once via asyncio.gather, durable timers), any I/O timing on the first execution, any
crash points, and any wake-up order on each replay:

* no replay ever creates a command other than the journaled one (no mismatch), and no
  replay waits on an op whose result is not journaled (no "await could not be replayed");
* nothing hangs (every attempt is bounded);
* every op's result is journaled exactly once, and each task sees the right values;
* a final replay of the complete journal re-creates exactly the same commands in the same
  order, creates none, and never waits on the journal.
"""

from __future__ import annotations

import asyncio
import operator
import random
from typing import Annotated, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from langgraph_deterministic.runner import DeterministicRunner, OpScheduler, durable
from langgraph_deterministic.runner._context import RunSpec, SleepSpec

from .fake_journal import Crash, FakeAttempt, FakeJournal, Store

ATTEMPT_TIMEOUT = 5.0  # bounds a hang; examples take milliseconds

step = st.one_of(
    st.tuples(st.just("work"), st.integers(0, 4)),
    st.tuples(st.just("ops"), st.integers(1, 3)),
    st.tuples(st.just("sleep"), st.just(0)),
)
programs = st.lists(st.lists(step, min_size=1, max_size=4), min_size=1, max_size=4)
crash_points = st.lists(st.integers(0, 25), max_size=3)


async def _ticks(rnd: random.Random, hi: int = 4) -> None:
    for _ in range(rnd.randint(0, hi)):
        await asyncio.sleep(0)


def _value(key: str) -> str:
    return f"v:{key}"


async def _task(
    sched: OpScheduler[Any], t: int, steps: list[tuple[str, int]], rnd: random.Random
) -> list[str]:
    seen: list[str] = []
    for s, (kind, n) in enumerate(steps):
        if kind == "work":
            for _ in range(n + rnd.randint(0, 2)):
                await asyncio.sleep(0)
            continue
        if kind == "sleep":  # a durable timer (ctx.sleep): handed back once witnessed
            await sched.request(f"t{t}/s{s}/sleep", SleepSpec(0.0))
            continue

        async def one(j: int, s: int = s) -> str:
            await _ticks(rnd, 3)
            key = f"t{t}/s{s}/op{j}"
            return str(await sched.request(key, RunSpec(key, _value, (key,), {})))

        seen.extend(await asyncio.gather(*(one(j) for j in range(n))))
    return seen


def _expected(program: list[list[tuple[str, int]]]) -> list[list[str]]:
    return [
        [
            _value(f"t{t}/s{s}/op{j}")
            for s, (kind, n) in enumerate(steps)
            if kind == "ops"
            for j in range(n)
        ]
        for t, steps in enumerate(program)
    ]


async def _attempt_core(
    store: Store, program: list[list[tuple[str, int]]], rnd: random.Random, crash_after: int | None
) -> tuple[FakeAttempt, list[list[str]] | None]:
    attempt = FakeAttempt(store, io_ticks=lambda _name: rnd.randint(0, 4), crash_after=crash_after)
    sched: OpScheduler[Any] = OpScheduler(attempt)
    sched.start()
    tasks = [asyncio.ensure_future(_task(sched, t, steps, rnd)) for t, steps in enumerate(program)]
    out: list[list[str]] | None = None
    try:
        out = list(await asyncio.wait_for(asyncio.gather(*tasks), ATTEMPT_TIMEOUT))
    except Crash:
        out = None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await sched.aclose()
        except Crash:
            out = None
        attempt.close()
    return attempt, out


def _check_store(store: Store, crashed: bool) -> None:
    # every op's result journaled exactly once (decisions are all named lgd:order)
    recorded = {k: n for k, n in store.recorded.items() if k != "lgd:order"}
    executed = {k: n for k, n in store.executions.items() if k != "lgd:order"}
    assert all(n == 1 for n in recorded.values()), recorded
    assert set(recorded) == set(executed)
    if not crashed:
        assert all(n == 1 for n in executed.values()), executed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs, crashes=crash_points, seed=st.integers(0, 2**32 - 1))
def test_replay_reproduces_the_journal(
    program: list[list[tuple[str, int]]], crashes: list[int], seed: int
) -> None:
    async def scenario() -> None:
        store = Store()
        rnd = random.Random(seed)
        out = None
        for crash_after in [*crashes, None]:
            # each attempt: new I/O timing and a new wake-up order
            _attempt, out = await _attempt_core(
                store, program, random.Random(rnd.random()), crash_after
            )
            if out is not None:
                break
        assert out == _expected(program)
        _check_store(store, crashed=bool(crashes))
        journal_before = list(store.commands)
        # a full replay with yet another timing: same commands, same order, no awaits
        attempt, again = await _attempt_core(store, program, random.Random(rnd.random()), None)
        assert again == _expected(program)
        assert store.commands == journal_before
        assert attempt.cursor == len(journal_before)
        assert attempt.polls == 0

    asyncio.run(scenario())


# -- the same, through LangGraph and DeterministicRunner (task keys from the submit hook) --

_RND: dict[str, random.Random] = {"r": random.Random(0)}


class S(TypedDict, total=False):
    n: int
    results: Annotated[list[str], operator.add]


def _graph() -> Any:
    async def op(label: str) -> str:
        return f"{label}:ok"

    async def jitter() -> None:
        await _ticks(_RND["r"], 3)

    def branch(i: int) -> Any:
        async def node(state: S) -> S:
            out = []
            for j in range(2):
                await jitter()
                out.append(await durable(f"op{j}", op, f"b{i}.{j}"))
            return {"results": out}

        return node

    async def worker(state: dict[str, Any]) -> S:
        await jitter()
        return {"results": [await durable("work", op, f"w{state['i']}")]}

    async def gathered(state: S) -> S:
        async def one(j: int) -> str:
            await jitter()
            return await durable(f"g{j}", op, f"g{j}")

        return {"results": list(await asyncio.gather(*(one(j) for j in range(3))))}

    inner = StateGraph(S)
    for j in range(2):
        inner.add_node(f"l{j}", branch(10 + j))
        inner.add_edge(START, f"l{j}")
        inner.add_edge(f"l{j}", END)
    sub = inner.compile()

    async def nested(state: S) -> S:
        out = await sub.ainvoke({"n": 0, "results": []})
        return {"results": out["results"]}

    def fan(state: S) -> list[Send]:
        return [Send("worker", {"i": i}) for i in range(state["n"])]

    async def start(state: S) -> S:
        return {"results": [await durable("start", op, "start")]}

    g = StateGraph(S)
    g.add_node("start", start)
    g.add_node("worker", worker)
    g.add_node("gathered", gathered)
    g.add_node("nested", nested)
    g.add_edge(START, "start")
    g.add_conditional_edges("start", fan, ["worker"])
    for i in range(2):
        g.add_node(f"b{i}", branch(i))
        g.add_edge("start", f"b{i}")
        g.add_edge(f"b{i}", END)
    g.add_edge("start", "gathered")
    g.add_edge("start", "nested")
    g.add_edge("gathered", END)
    g.add_edge("nested", END)
    g.add_edge("worker", END)
    return g.compile()


GRAPH = _graph()


def _graph_expected(n: int) -> list[str]:
    labels = [
        "start",
        *(f"b{i}.{j}" for i in (0, 1, 10, 11) for j in range(2)),
        *(f"w{i}" for i in range(n)),
        "g0",
        "g1",
        "g2",
    ]
    return sorted(f"{x}:ok" for x in labels)


async def _attempt_graph(
    store: Store, n: int, rnd: random.Random, crash_after: int | None
) -> tuple[FakeAttempt, list[str] | None]:
    attempt = FakeAttempt(store, io_ticks=lambda _name: rnd.randint(0, 4), crash_after=crash_after)
    _RND["r"] = rnd
    runner = DeterministicRunner(journal=FakeJournal(attempt))
    try:
        out = await asyncio.wait_for(
            runner.ainvoke(GRAPH, {"n": n, "results": []}), ATTEMPT_TIMEOUT
        )
    except Crash:
        return attempt, None
    return attempt, sorted(out["results"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 4), crashes=crash_points, seed=st.integers(0, 2**32 - 1))
def test_graph_replay_reproduces_the_journal(n: int, crashes: list[int], seed: int) -> None:
    async def scenario() -> None:
        store = Store()
        rnd = random.Random(seed)
        out = None
        for crash_after in [*crashes, None]:
            _attempt, out = await _attempt_graph(store, n, random.Random(rnd.random()), crash_after)
            if out is not None:
                break
        assert out == _graph_expected(n)
        _check_store(store, crashed=bool(crashes))
        before = list(store.commands)
        attempt, again = await _attempt_graph(store, n, random.Random(rnd.random()), None)
        assert again == out
        assert store.commands == before
        assert attempt.cursor == len(before) and attempt.polls == 0

    asyncio.run(scenario())


# -- the journal rules are strict enough to catch the known bug ---------------------------


class _ArrivalOrderScheduler(OpScheduler[Any]):
    """What breaks on Restate today: ops created in arrival order, nothing recorded."""

    def _create_planned(self) -> bool:
        created = False
        for key in list(self._pending):
            req = self._pending.pop(key)
            self._inflight[self._backend.start_op(req.key, req.spec)] = req
            created = True
        return created


def test_the_fake_journal_catches_arrival_order_creation() -> None:
    from .fake_journal import AwaitDuringReplay, JournalMismatch

    program = [[("ops", 1), ("ops", 1)] for _ in range(4)]

    async def attempt(store: Store, rnd: random.Random) -> None:
        backend = FakeAttempt(store, io_ticks=lambda _n: rnd.randint(0, 6))
        sched: OpScheduler[Any] = _ArrivalOrderScheduler(backend)
        sched.start()
        tasks = [asyncio.ensure_future(_task(sched, t, s, rnd)) for t, s in enumerate(program)]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), ATTEMPT_TIMEOUT)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await sched.aclose()

    caught = 0
    for seed in range(20):
        store = Store()
        asyncio.run(attempt(store, random.Random(seed)))
        try:
            asyncio.run(attempt(store, random.Random(seed + 1000)))
        except (JournalMismatch, AwaitDuringReplay):
            caught += 1
    assert caught > 0
