"""``put_batch``: a run's buffered writes in one transaction, at most once per run (the hook
DeterministicRunner commits through under a durable journal). The sync driver here; the
async one is exercised end to end in tests/runner/test_saver_under_journal.py."""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic import DeterministicSaver, run_config


class S(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


class Recording(InMemorySaver):
    """An InMemorySaver that keeps the calls a graph run made, as put_batch takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[Any, ...]] = []

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self.log.append(("put", config, checkpoint, metadata, new_versions))
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.log.append(("writes", config, list(writes), task_id, task_path))
        super().put_writes(config, writes, task_id, task_path)


def graph(checkpointer: Any) -> Any:
    g = StateGraph(S)
    for n in ("a", "b"):
        g.add_node(n, lambda s, n=n: {"items": [n]})
        g.add_edge(START, n)
        g.add_edge(n, END)
    return g.compile(checkpointer=checkpointer)


@pytest.fixture(scope="module")
def saver(dsn: str) -> Iterator[DeterministicSaver]:
    with DeterministicSaver(dsn) as s:
        s.setup()
        yield s


def test_put_batch_stores_a_run_once(saver: DeterministicSaver) -> None:
    thread = f"batch-{uuid.uuid4().hex[:8]}"
    rec = Recording()
    graph(rec).invoke({"items": []}, run_config(thread, "r1"))
    assert saver.put_batch(rec.log) is None  # stored
    cfg = {"configurable": {"thread_id": thread}}
    history = [t.checkpoint["id"] for t in saver.list(cfg)]
    assert len(history) == len([i for i in rec.log if i[0] == "put"])
    # The same run's commit again (a retried commit): nothing written, the continuation named.
    again = saver.put_batch(rec.log)
    assert again == history[-1]  # the first checkpoint the run stored
    assert [t.checkpoint["id"] for t in saver.list(cfg)] == history
    state = graph(saver).get_state(cfg)
    assert sorted(state.values["items"]) == ["a", "b"]
    run = saver.get_run(thread, "r1")
    assert run is not None and run.attempts == 1
