"""DeterministicRunner keeps LangGraph's semantics: errors, retries, interrupts, cancellation,
streaming; and fails loudly when node code breaks the replay rules.

These run real LangGraph graphs on the in-memory journal (Restate's replay rules, see
fake_journal.py); the Restate end-to-end tests are in test_restate_e2e.py.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import operator
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from typing_extensions import TypedDict

from langgraph_deterministic.errors import DeterministicError, IncompatibleLangGraphError
from langgraph_deterministic.runner import DeterministicRunner, NondeterminismError, durable
from langgraph_deterministic.runner._runner import check_langgraph

from .fake_journal import FakeAttempt, FakeJournal, Store


class S(TypedDict, total=False):
    results: Annotated[list[str], operator.add]


def runner_on(store: Store, **kw: Any) -> DeterministicRunner:
    return DeterministicRunner(journal=FakeJournal(FakeAttempt(store, io_ticks=lambda _n: 1)), **kw)


def parallel(nodes: dict[str, Any], **kw: Any) -> Any:
    g = StateGraph(S)
    for name, fn in nodes.items():
        g.add_node(name, fn, **kw.get(name, {}))
        g.add_edge(START, name)
        g.add_edge(name, END)
    return g


async def test_durable_outside_a_runner_just_calls() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    assert await durable("add", add, 1, 2) == 3
    assert await durable("mul", lambda a, b: a * b, 3, 4) == 12


async def test_op_failure_reaches_the_node_like_any_exception() -> None:
    def boom() -> str:
        raise ValueError("terminal")

    async def node(state: S) -> S:
        try:
            await durable("boom", boom)
        except ValueError as exc:
            return {"results": [f"caught {exc}"]}
        return {"results": ["not raised"]}

    async def other(state: S) -> S:
        return {"results": [await durable("ok", lambda: "ok")]}

    store = Store()
    out = await runner_on(store).ainvoke(parallel({"a": node, "b": other}).compile(), {})
    assert sorted(out["results"]) == ["caught terminal", "ok"]
    # replay: the failure comes back from the journal, not from calling boom again
    before = dict(store.executions)
    out2 = await runner_on(store).ainvoke(parallel({"a": node, "b": other}).compile(), {})
    assert sorted(out2["results"]) == ["caught terminal", "ok"]
    assert store.executions == before


async def test_retry_policy_retries_the_node() -> None:
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionError("flaky")
        return "ok"

    async def node(state: S) -> S:
        return {"results": [await durable("flaky", flaky)]}

    async def other(state: S) -> S:
        return {"results": [await durable("other", lambda: "other")]}

    g = parallel(
        {"a": node, "b": other},
        a={"retry_policy": RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)},
    ).compile()
    out = await runner_on(Store()).ainvoke(g, {})
    assert sorted(out["results"]) == ["ok", "other"]
    assert calls["n"] == 3


async def test_failing_sibling_cancels_the_others_and_no_task_leaks() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(state: S) -> S:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    async def failing(state: S) -> S:
        await started.wait()
        await durable("x", lambda: "x")
        raise RuntimeError("branch failed")

    before = set(asyncio.all_tasks())
    with pytest.raises(RuntimeError, match="branch failed"):
        await runner_on(Store()).ainvoke(parallel({"slow": slow, "failing": failing}).compile(), {})
    assert cancelled.is_set()
    leaked = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert not leaked, leaked


async def test_interrupt_and_resume_behave_as_without_the_runner() -> None:
    async def ask(state: S) -> S:
        answer = interrupt("question?")
        return {"results": [f"answer {answer}"]}

    async def side(state: S) -> S:
        return {"results": [await durable("side", lambda: "side")]}

    g = parallel({"ask": ask, "side": side}).compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t"}}
    runner = runner_on(Store())
    first = await runner.ainvoke(g, {}, cfg)
    assert first["__interrupt__"][0].value == "question?"
    done = await runner_on(Store()).ainvoke(g, Command(resume="yes"), cfg)
    assert sorted(done["results"]) == ["answer yes", "side"]


async def test_astream_passes_every_stream_mode_through() -> None:
    async def a(state: S) -> S:
        get_stream_writer()({"custom": "a"})
        return {"results": [await durable("a", lambda: "a")]}

    async def b(state: S) -> S:
        return {"results": [await durable("b", lambda: "b")]}

    g = parallel({"a": a, "b": b}).compile()
    modes = ["values", "updates", "custom", "debug"]
    chunks = [c async for c in runner_on(Store()).astream(g, {"results": []}, stream_mode=modes)]
    plain = [c async for c in g.astream({"results": []}, stream_mode=modes)]
    assert sorted(m for m, _ in chunks) == sorted(m for m, _ in plain)
    assert ("custom", {"custom": "a"}) in chunks
    assert [v for m, v in chunks if m == "values"][-1]["results"] == sorted(["a", "b"])


async def test_a_node_that_skips_a_journaled_op_on_replay_fails_loudly() -> None:
    flip = {"do_it": True}

    async def node(state: S) -> S:
        if flip["do_it"]:  # control flow from a global, not from state or durable results
            await durable("maybe", lambda: "maybe")
        return {"results": [await durable("always", lambda: "always")]}

    async def other(state: S) -> S:
        return {"results": [await durable("other", lambda: "other")]}

    g = parallel({"n": node, "o": other}).compile()
    store = Store()
    await runner_on(store).ainvoke(g, {})
    flip["do_it"] = False
    with pytest.raises(NondeterminismError, match="different path"):
        await asyncio.wait_for(runner_on(store, replay_stall_timeout=0.2).ainvoke(g, {}), 20)


async def test_concurrent_ops_of_one_name_in_one_task_get_distinct_keys() -> None:
    # asyncio.gather starts its children in argument order, so "dup#0" and "dup#1" are
    # assigned deterministically; both results come back to the right caller.
    async def node(state: S) -> S:
        a, b = await asyncio.gather(durable("dup", lambda: "1"), durable("dup", lambda: "2"))
        return {"results": [a, b]}

    store = Store()
    out = await runner_on(store).ainvoke(parallel({"n": node}).compile(), {})
    assert out["results"] == ["1", "2"]
    names = [name for kind, name in store.commands if kind == "op"]
    assert len(set(names)) == 2 and all(n.split("#")[0].endswith(":dup") for n in names)


async def test_a_durable_op_inside_a_durable_op_is_refused() -> None:
    async def inner() -> str:
        return await durable("inner", lambda: "inner")

    async def node(state: S) -> S:
        try:
            await durable("outer", inner)
        except NondeterminismError as exc:
            return {"results": ["refused" if "inside durable op" in str(exc) else str(exc)]}
        return {"results": ["allowed"]}

    out = await runner_on(Store()).ainvoke(parallel({"n": node}).compile(), {})
    assert out["results"] == ["refused"]


def test_incompatible_langgraph_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.version

    def fake_version(name: str) -> str:
        return "1.3.0" if name == "langgraph" else real(name)

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    check_langgraph.cache_clear()  # checked once per process: forget the real version's pass
    try:
        with pytest.raises(IncompatibleLangGraphError, match=r"langgraph>=1\.2\.18,<1\.3"):
            DeterministicRunner(journal=FakeJournal(FakeAttempt(Store(), io_ticks=lambda _n: 0)))
    finally:
        check_langgraph.cache_clear()


async def test_runs_cannot_nest() -> None:
    inner = parallel({"x": lambda s: {"results": ["x"]}}).compile()

    async def node(state: S) -> S:
        await runner_on(Store()).ainvoke(inner, {})
        return {}

    with pytest.raises(DeterministicError, match="cannot nest"):
        await runner_on(Store()).ainvoke(parallel({"n": node}).compile(), {})


async def test_nondeterminism_error_is_a_deterministic_error() -> None:
    assert issubclass(NondeterminismError, DeterministicError)


async def _slow(label: str) -> str:
    await asyncio.sleep(0.05)
    return label


async def test_identical_names_racing_in_one_task_fail_loudly() -> None:
    async def node(state: S) -> S:
        async def one(url: str, delay: float) -> str:
            await asyncio.sleep(delay)  # non-durable work first: asking order is timing
            return await durable("fetch", _slow, url)

        return {"results": list(await asyncio.gather(one("a", 0.0), one("b", 0.01)))}

    with pytest.raises(NondeterminismError, match="distinct names"):
        await runner_on(Store()).ainvoke(parallel({"n": node}).compile(), {})


async def test_identical_names_in_a_fixed_order_and_distinct_names_pass() -> None:
    async def node(state: S) -> S:
        # bare durable() coroutines ask in creation order: deterministic
        fixed = await asyncio.gather(durable("x", _slow, "1"), durable("x", _slow, "2"))

        async def one(url: str) -> str:
            await asyncio.sleep(0.001)
            return await durable(f"fetch:{url}", _slow, url)  # names with "/" in them

        urls = ["http://a/x", "http://b/x"]
        distinct = await asyncio.gather(*(one(u) for u in urls))
        sequential = [await durable("x", _slow, "3")]  # same name, later, same task
        return {"results": [*fixed, *distinct, *sequential]}

    store = Store()
    out = await runner_on(store).ainvoke(parallel({"n": node}).compile(), {})
    assert out["results"] == ["1", "2", "http://a/x", "http://b/x", "3"]
    again = await runner_on(store).ainvoke(parallel({"n": node}).compile(), {})
    assert again["results"] == out["results"]


async def test_idempotency_key_on_an_ordered_journal_is_stable_across_replay() -> None:
    from langgraph_deterministic.runner import idempotency_key

    keys: list[str] = []

    def pay() -> str:
        keys.append(idempotency_key())
        return keys[-1]

    async def node(state: S) -> S:
        return {"results": [await durable("pay", pay), await durable("pay", pay)]}

    async def other(state: S) -> S:
        return {"results": [await durable("pay", pay)]}

    store = Store()
    graph = parallel({"a": node, "b": other}).compile()
    out = await runner_on(store).ainvoke(graph, {})
    assert len(set(keys)) == 3 and sorted(out["results"]) == sorted(keys)
    replayed = await runner_on(store).ainvoke(graph, {})
    assert sorted(replayed["results"]) == sorted(keys) and len(keys) == 3


async def test_durable_sync_is_refused_on_an_ordered_journal() -> None:
    from langgraph_deterministic.errors import ConfigurationError
    from langgraph_deterministic.runner import durable_sync

    async def node(state: S) -> S:
        return {"results": [durable_sync("x", lambda: "x")]}

    async def other(state: S) -> S:
        return {"results": []}

    with pytest.raises(ConfigurationError, match="ordered journal"):
        await runner_on(Store()).ainvoke(parallel({"a": node, "b": other}).compile(), {})


async def test_submit_scope_honours_reraise_on_exit() -> None:
    """LangGraph's executor re-raises, when its loop exits cleanly, the first error of a
    task submitted with ``__reraise_on_exit__=True`` (not of one submitted with False, nor
    an interrupt); the runner's submit scope does the same at the end of a run."""
    from langgraph.errors import GraphInterrupt

    from langgraph_deterministic.runner._runner import _SubmitScope

    async def fails(message: str) -> None:
        raise ValueError(message)

    async def interrupted() -> None:
        raise GraphInterrupt(())

    scope = _SubmitScope("run")
    quiet = scope.submit(fails, "quiet", __reraise_on_exit__=False)
    bubble = scope.submit(interrupted)
    loud = scope.submit(fails, "loud")
    await asyncio.gather(quiet, bubble, loud, return_exceptions=True)
    with pytest.raises(ValueError, match="loud"):
        scope.reraise()

    clean = _SubmitScope("run")
    await asyncio.gather(clean.submit(fails, "x", __reraise_on_exit__=False), return_exceptions=True)
    clean.reraise()  # nothing to re-raise


async def _sleep(name: str = "sleep") -> None:
    """What ``ctx.sleep`` / ``restate_context().sleep`` do inside a run (the routed
    context's ``sleep``): request a durable timer from the ordering core and await it."""
    from langgraph_deterministic.runner._context import SleepSpec, request

    fut = request(SleepSpec(0.0), name)
    assert fut is not None
    await fut


async def test_a_fired_timer_is_witnessed_once_and_the_run_goes_on() -> None:
    """Parallel branches with a durable timer between two ops (the e2e 'sleepy' shape).

    Once a decision listing a fired timer (``~<key>``) has been created, the timer must
    not count as "fired, not yet in a decision" again while that decision is in flight.
    It used to: the same driver pass put it back in that list, the decision's value then
    let the timer be taken, and the next decision looked up the taken timer and raised
    KeyError, which ended the attempt (on Restate: a retryable error, the invocation
    retried, and any side effect still running in the failed attempt ran again)."""

    def branch(i: int) -> Any:
        async def node(state: S) -> S:
            a = await durable("before", lambda: f"z{i}.before")
            await _sleep()
            b = await durable("after", lambda: f"z{i}.after")
            return {"results": [a, b]}

        return node

    graph = parallel({f"z{i}": branch(i) for i in range(3)}).compile()
    want = sorted(f"z{i}.{x}" for i in range(3) for x in ("before", "after"))
    store = Store()
    out = await asyncio.wait_for(runner_on(store).ainvoke(graph, {}), 5)
    assert sorted(out["results"]) == want
    ops = {k: n for k, n in store.executions.items() if k != "lgd:order"}
    assert sorted(ops) == sorted(f"run/z{i}@1/z{i}@1:{x}#0" for i in range(3) for x in ("before", "after"))
    assert all(n == 1 for n in ops.values()), ops
    # every timer was witnessed by exactly one decision
    witnessed = [
        k
        for idx, (kind, _) in enumerate(store.commands)
        if kind == "decision"
        for k in store.results[idx][1]
        if k.startswith("~")
    ]
    assert sorted(witnessed) == [f"~run/z{i}@1/z{i}@1:sleep#0" for i in range(3)], witnessed
    # a replay of the complete journal returns the same, creates nothing and runs nothing
    commands, executions = list(store.commands), dict(store.executions)
    again = await asyncio.wait_for(runner_on(store).ainvoke(graph, {}), 5)
    assert sorted(again["results"]) == want
    assert store.commands == commands and store.executions == executions
