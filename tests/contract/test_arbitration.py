"""The split of the retry contract between Python and the commit-time SQL (migration 0016): whether
a new run found the previous one finished is decided by ``contract.guard_put`` from
LangGraph's checkpoints and reaches ``lgd_put_checkpoint_v6`` as a plain parameter.

Database-free checks of that decision, and end-to-end checks of the paths that do not
come through a graph run's start read (a direct ``put``)."""

from __future__ import annotations

from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from tests.contract.graphs import ask, build_pipeline

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.checkpointer.contract import (
    ATTEMPT_KEY,
    GRAPH_RUN_MARKER,
    HEAD_KEY,
    RunContract,
    head_mark,
    progress_digest,
)
from langgraph_deterministic.config import run_config

ARBITRATION = "0016_pre_arbitration_v6.sql"


def _checkpoint(seen: dict[str, dict[str, Any]], tasks: Any = None) -> dict[str, Any]:
    cp: dict[str, Any] = dict(empty_checkpoint())
    cp["versions_seen"] = seen
    cp["channel_versions"] = {} if tasks is None else {"__pregel_tasks": tasks}
    return cp


def test_progress_digest_ignores_interrupts_and_version_types() -> None:
    base = _checkpoint({"a": {"x": "00001.5"}, "__input__": {}})
    same = _checkpoint({"a": {"x": "00001.5"}, "__input__": {}, "__interrupt__": {"x": "9"}})
    assert progress_digest(base) == progress_digest(same)
    assert progress_digest(_checkpoint({"a": {"x": 1}})) == progress_digest(
        _checkpoint({"a": {"x": "1"}})
    )
    # a discarded task was marked seen, or pending Sends were consumed: not the same
    assert progress_digest(base) != progress_digest(_checkpoint({"a": {"x": "00002.1"}}))
    assert progress_digest(base) != progress_digest(
        _checkpoint({"a": {"x": "00001.5"}, "__input__": {}}, tasks="00003.1")
    )


def _graph_write(contract: RunContract, run: str, parent: str, head: str | None) -> Any:
    configurable: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": "", GRAPH_RUN_MARKER: 1}
    if head is not None:
        configurable[HEAD_KEY] = head
    config: RunnableConfig = {"configurable": configurable, "metadata": {"run_id": run}}
    return contract.call_info(config, "t", ""), parent


def test_the_first_write_after_a_finished_run_closes_it_as_done() -> None:
    contract = RunContract(policy="require")
    finished = _checkpoint({"a": {"x": "1"}})
    head = head_mark("cp-1", {"run_id": "A"}, finished)
    info, parent = _graph_write(contract, "B", "cp-1", head)
    same = _checkpoint({"a": {"x": "1"}})
    guard = contract.guard_put(info, parent, same, "input")
    assert guard is not None and (guard["closes"], guard["closes_run"]) == ("done", "A")
    moved = _checkpoint({"a": {"x": "2"}})
    guard = contract.guard_put(info, parent, moved, "input")
    assert guard is not None and (guard["closes"], guard["closes_run"]) == ("superseded", "A")
    guard = contract.guard_put(info, parent, same, "loop")  # not an input: moved on
    assert guard is not None and guard["closes"] == "superseded"


def test_later_writes_and_own_runs_close_nothing() -> None:
    contract = RunContract(policy="require")
    head = head_mark("cp-1", {"run_id": "A"}, _checkpoint({}))
    info, _ = _graph_write(contract, "B", "cp-2", head)  # continues its own cp-2
    guard = contract.guard_put(info, "cp-2", _checkpoint({}), "loop")
    assert guard is not None and guard["closes"] is None
    info, _ = _graph_write(contract, "A", "cp-1", head)  # a retry of A on its own head
    guard = contract.guard_put(info, "cp-1", _checkpoint({}), "input")
    assert guard is not None and guard["closes"] is None
    # a write the contract knows nothing about: the SQL reads the parent's run id
    info, _ = _graph_write(contract, "B", "cp-9", None)
    guard = contract.guard_put(info, "cp-9", _checkpoint({}), "loop")
    assert guard is not None and (guard["closes"], guard["closes_run"]) == ("superseded", None)


def test_the_arbitration_sql_reads_no_langgraph_checkpoint_format() -> None:
    from importlib import resources

    text = (
        resources.files("langgraph_deterministic") / "migrations" / ARBITRATION
    ).read_text("utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    for private in ("versions_seen", "channel_versions", "__pregel", "'source'", "-> 'checkpoint'"):
        assert private not in body, private


# --- end to end: writes outside a graph run ----------------------------------------------


def _status(db: str, thread: str, run: str) -> tuple[str, str | None]:
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT status, superseded_by FROM lgd_runs WHERE thread_id = %s AND run_id = %s",
            (thread, run),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _direct_input(
    saver: DeterministicSaver, thread: str, run: str, same: bool, attempt: str | None
) -> None:
    """A root ``put`` outside a graph run, of an input on the thread's head."""
    head = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert head is not None
    checkpoint = {**head.checkpoint, "id": str(uuid6(clock_seq=-2))}
    if not same:
        checkpoint["versions_seen"] = {**checkpoint["versions_seen"], "extra": {"x": "1"}}
    configurable = dict(head.config["configurable"])
    if attempt is not None:  # a config that came out of a graph run: not a deliberate branch
        configurable[ATTEMPT_KEY] = attempt
    config: RunnableConfig = {"configurable": configurable, "metadata": {"run_id": run}}
    saver.put(config, checkpoint, {"source": "input", "step": 99}, {})  # type: ignore[arg-type]


def test_a_direct_input_on_a_finished_run_reads_its_parent_and_closes_it_done(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config("direct-done", "A"))
    _direct_input(saver, "direct-done", "B", same=True, attempt="a1")
    assert _status(db, "direct-done", "A") == ("done", "B")


def test_a_direct_input_that_changes_progress_supersedes(
    db: str, saver: DeterministicSaver
) -> None:
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config("direct-moved", "A"))
    _direct_input(saver, "direct-moved", "B", same=False, attempt="a1")
    assert _status(db, "direct-moved", "A") == ("superseded", "B")


def test_a_deliberate_write_closes_nothing(db: str, saver: DeterministicSaver) -> None:
    """Without an attempt token a write outside a graph run is a deliberate branch
    (update_state at a checkpoint): the run it branches from keeps its status."""
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config("direct-branch", "A"))
    before = _status(db, "direct-branch", "A")
    _direct_input(saver, "direct-branch", "B", same=True, attempt=None)
    assert _status(db, "direct-branch", "A") == before
