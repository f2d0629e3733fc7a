"""The oracle harness (benchmarks/langgraph_suite/lgd_swap.py) gives run ids as a user under
``run_id_policy="require"`` does: a new id per root call, the failed run's own id when a call
retries it (no input, or a resume). Checked on a real graph; the saver does not matter here."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.pregel import Pregel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "langgraph_suite"))
import lgd_swap


class _State(TypedDict):
    x: int


@pytest.fixture
def give_run_ids() -> Iterator[list[Any]]:
    """The harness's wrappers installed; yields the inputs Pregel.stream was called with."""
    names = ("stream", "astream", "bulk_update_state", "abulk_update_state")
    saved = {name: getattr(Pregel, name) for name in names}
    inputs: list[Any] = []

    def spy(self: Any, input: Any, *args: Any, **kw: Any) -> Any:
        inputs.append(input)
        return saved["stream"](self, input, *args, **kw)

    Pregel.stream = spy  # type: ignore[method-assign]
    lgd_swap._give_run_ids()
    lgd_swap._last_runs.clear()
    try:
        yield inputs
    finally:
        for name, original in saved.items():
            setattr(Pregel, name, original)
        lgd_swap._last_runs.clear()


def _graph(seen: list[str], fail: list[bool]) -> Any:
    def node(state: _State, config: RunnableConfig) -> _State:
        seen.append(config["metadata"]["run_id"])
        if fail and fail.pop(0):
            raise ValueError("fails this time")
        return {"x": state["x"] + 1}

    builder = StateGraph(_State).add_node("n", node).add_edge(START, "n")
    return builder.compile(checkpointer=InMemorySaver())


def test_a_retry_keeps_the_failed_runs_id_and_input_and_new_input_gets_a_new_id(
    give_run_ids: list[Any],
) -> None:
    seen: list[str] = []
    graph = _graph(seen, [True, False, False, True, True, False])
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    with pytest.raises(ValueError):
        graph.invoke({"x": 0}, config)
    graph.invoke(None, config)  # the retry
    graph.invoke({"x": 5}, config)  # a new run after one that finished
    with pytest.raises(ValueError):
        graph.invoke({"x": 7}, config)
    with pytest.raises(ValueError):
        graph.invoke({"x": 7}, config)  # the same input re-sent: a retry too
    graph.invoke({"x": 9}, config)  # new input after a failure: a new run, not a retry
    assert seen[0] == seen[1]
    assert seen[3] == seen[4]
    assert len(set(seen)) == 4, seen
    # The retry is called as the contract says a user retries: the original input.
    assert give_run_ids == [{"x": 0}, {"x": 0}, {"x": 5}, {"x": 7}, {"x": 7}, {"x": 9}]
    assert all(run_id.startswith("suite-") for run_id in seen)


@pytest.mark.usefixtures("give_run_ids")
def test_async_retry_keeps_the_id_and_update_state_ends_the_failed_run() -> None:
    seen: list[str] = []
    graph = _graph(seen, [True, False, True, False])
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}

    async def main() -> None:
        with pytest.raises(ValueError):
            await graph.ainvoke({"x": 0}, config)
        await graph.ainvoke(None, config)
        with pytest.raises(ValueError):
            await graph.ainvoke({"x": 1}, config)
        await graph.aupdate_state(config, {"x": 3})  # the head is the update's now
        await graph.ainvoke(None, config)

    asyncio.run(main())
    assert seen[0] == seen[1]
    assert seen[3] not in seen[:3]
    assert len(set(seen)) == 3, seen
