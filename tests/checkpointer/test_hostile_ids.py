"""Ids Postgres cannot store (a NUL character, a lone surrogate, 10,000 characters) in
thread_id, checkpoint_ns, checkpoint_id or run_id get our error before anything is
written, on every path that takes them; the threads beside them are untouched."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_deterministic import ConfigurationError, DeterministicSaver, run_config

BAD = {"nul": "a\x00b", "surrogate": "x\ud800", "long": "x" * 10_000}
FIELDS = ("thread_id", "checkpoint_ns", "checkpoint_id", "run_id")


def _rows(dsn: str) -> tuple[int, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoints), (SELECT count(*) FROM checkpoint_blobs),"
            " (SELECT count(*) FROM checkpoint_writes), (SELECT count(*) FROM lgd_runs)"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture(scope="module")
def saver(db: str) -> Iterator[DeterministicSaver]:
    with DeterministicSaver(db, run_id_policy="warn") as s:
        yield s


def _graph(saver: DeterministicSaver) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("ok")]}

    builder = StateGraph(MessagesState).add_node(reply).add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


def _ids(field: str, bad: str) -> dict[str, str]:
    ids = {"thread_id": "t-ok", "checkpoint_ns": "", "run_id": "r-ok"}
    ids[field] = bad
    return ids


def _calls(saver: DeterministicSaver, field: str, bad: str) -> dict[str, Callable[[], Any]]:
    ids = _ids(field, bad)
    extra = {"checkpoint_id": ids["checkpoint_id"]} if "checkpoint_id" in ids else {}
    config = run_config(ids["thread_id"], ids["run_id"], **extra)
    if ids["checkpoint_ns"]:
        config["configurable"]["checkpoint_ns"] = ids["checkpoint_ns"]
    graph = _graph(saver)
    direct = {
        "configurable": {
            "thread_id": ids["thread_id"], "checkpoint_ns": ids["checkpoint_ns"],
            "run_id": ids["run_id"], **extra,
        },
        "metadata": {"run_id": ids["run_id"]},
    }  # fmt: skip
    checkpoint = empty_checkpoint()
    write_config = {"configurable": {**direct["configurable"], "checkpoint_id": ids.get("checkpoint_id", checkpoint["id"])}}
    calls: dict[str, Callable[[], Any]] = {
        "put": lambda: saver.put(direct, checkpoint, {"source": "input", "step": -1, "run_id": ids["run_id"]}, {}),
        "put_writes": lambda: saver.put_writes(write_config, [("messages", ["x"])], "task-1"),
    }  # fmt: skip
    if field != "checkpoint_ns":  # a graph call sets the root namespace itself
        calls["invoke"] = lambda: graph.invoke({"messages": [("user", "hi")]}, config)
    if field != "run_id":  # reads take no run id
        calls["get_tuple"] = lambda: saver.get_tuple(direct)
        calls["list"] = lambda: list(saver.list(direct))
    else:
        calls["get_run"] = lambda: saver.get_run(ids["thread_id"], ids["run_id"])
    return calls


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("field", FIELDS)
def test_an_id_postgres_cannot_store_gets_our_error_and_writes_nothing(
    db: str, saver: DeterministicSaver, field: str, kind: str
) -> None:
    graph = _graph(saver)
    graph.invoke({"messages": [("user", "hi")]}, run_config("beside", f"beside-{field}-{kind}"))
    before = _rows(db)
    for name, call in _calls(saver, field, BAD[kind]).items():
        if kind == "long" and name in ("get_tuple", "list", "get_run"):
            call()  # a long id is only too long to index: a read of it finds nothing
            continue
        with pytest.raises(ConfigurationError) as err:
            call()
            pytest.fail(f"{name} took the {field}")
        message = str(err.value)
        assert "Nothing was run or written" in message, (name, message)
        assert field in message or "ids of this call are too long" in message, (name, message)
        assert _rows(db) == before, name
    state = graph.get_state(run_config("beside", "any"))
    assert state.values["messages"][-1].content == "ok"
