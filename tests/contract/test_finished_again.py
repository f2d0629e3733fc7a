"""A call of a run that had finished is taken as a retry: it returns the final state and
runs nothing. New work under a reused run id (a user saying "yes" twice, an activity name
reused) would be dropped so: the call is logged with the run and when it finished, and
``run_config(..., on_finished="raise")`` refuses it instead."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pytest
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_deterministic import (
    ConfigurationError,
    DeterministicSaver,
    RunSupersededError,
    is_retryable,
    run_config,
)

LOGGER = "langgraph_deterministic"


def _graph(saver: DeterministicSaver, calls: list[str], fail_first: bool = False) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        calls.append(state["messages"][-1].content)
        if fail_first and len(calls) == 1:
            raise ConnectionError("the model provider went away")
        return {"messages": [("ai", f"answer {len(calls)}")]}

    builder = StateGraph(MessagesState)
    builder.add_node(reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


def _rows(dsn: str, thread: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s",
                           (thread,)).fetchone()  # fmt: skip
    assert row is not None
    return int(row[0])


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and "had returned" in r.getMessage()]  # fmt: skip


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_same_run_id_and_input_again_returns_the_final_state_and_says_so(
    db: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    calls: list[str] = []
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with DeterministicSaver(db) as saver:
        graph = _graph(saver, calls)

        def call(text: str, run: str) -> Any:
            config = run_config(thread, run)
            if mode == "sync":
                return graph.invoke({"messages": [("user", text)]}, config)
            import asyncio

            return asyncio.run(graph.ainvoke({"messages": [("user", text)]}, config))

        first = call("yes", "turn-1")
        assert not _warnings(caplog)  # a first call is not a retry
        again = call("yes", "turn-1")  # the mistake: turn 2 under turn 1's run id
        assert again["messages"] == first["messages"] and calls == ["yes"]
        (warning,) = _warnings(caplog)
        assert "Run 'turn-1'" in warning and repr(thread) in warning, warning
        assert " s ago" in warning and "give each new call a new run id" in warning, warning


def test_a_late_retry_after_a_later_run_is_logged_too(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    calls: list[str] = []
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with DeterministicSaver(db) as saver:
        graph = _graph(saver, calls)
        first = graph.invoke({"messages": [("user", "yes")]}, run_config(thread, "turn-1"))
        graph.invoke({"messages": [("user", "and then?")]}, run_config(thread, "turn-2"))
        late = graph.invoke({"messages": [("user", "yes")]}, run_config(thread, "turn-1"))
        assert late["messages"] == first["messages"] and calls == ["yes", "and then?"]
        (warning,) = _warnings(caplog)
        assert "Run 'turn-1'" in warning, warning


def test_on_finished_raise_refuses_it_and_writes_nothing(db: str) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    calls: list[str] = []
    with DeterministicSaver(db) as saver:
        graph = _graph(saver, calls)
        strict = run_config(thread, "turn-1", on_finished="raise")
        graph.invoke({"messages": [("user", "yes")]}, strict)
        before = _rows(db, thread)
        with pytest.raises(RunSupersededError, match="had returned") as caught:
            graph.invoke({"messages": [("user", "yes")]},
                         run_config(thread, "turn-1", on_finished="raise"))  # fmt: skip
        assert "give it a new run id" in str(caught.value)
        assert not is_retryable(caught.value)
        assert _rows(db, thread) == before and calls == ["yes"]
        # the refusal left the thread free: the next turn runs at once
        out = graph.invoke({"messages": [("user", "yes")]},
                           run_config(thread, "turn-2", on_finished="raise"))  # fmt: skip
        assert calls == ["yes", "yes"] and out["messages"][-1].content == "answer 2"


def test_on_finished_raise_still_retries_a_run_that_did_not_finish(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    calls: list[str] = []
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with DeterministicSaver(db) as saver:
        graph = _graph(saver, calls, fail_first=True)
        config = lambda: run_config(thread, "turn-1", on_finished="raise")  # noqa: E731
        with pytest.raises(ConnectionError):
            graph.invoke({"messages": [("user", "yes")]}, config())
        out = graph.invoke({"messages": [("user", "yes")]}, config())  # the retry runs
        assert out["messages"][-1].content == "answer 2" and calls == ["yes", "yes"]
        assert not _warnings(caplog)


def test_on_finished_takes_return_or_raise() -> None:
    with pytest.raises(ConfigurationError, match="on_finished must be 'return' or 'raise'"):
        run_config("t", "r", on_finished="ignore")  # type: ignore[arg-type]
