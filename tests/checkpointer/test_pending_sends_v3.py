"""Checkpoints older than format v4 (LangGraph < 0.3): their pending Sends are not in the
checkpoint's TASKS channel but stored as ``__pregel_tasks`` writes of its parent. The
saver folds them back in when it reads such a checkpoint, as the peer does, so a thread
written by an old LangGraph resumes with its fan-out intact.

The rows are made the way LangGraph < 0.3 left them: a graph stops with Sends pending
(``interrupt_before`` their node); its head is then rewritten to format v3: the TASKS
value, its blob and its version leave the checkpoint, so the Sends are only where the old
format kept them, the fanning-out task's writes to the parent."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.serde.types import TASKS
from langgraph.types import Send

from langgraph_deterministic import DeterministicSaver

from .graphs import build_graph, first_input


@pytest.fixture(scope="module")
def saver(dsn: str) -> Any:
    with DeterministicSaver(dsn, run_id_policy="off") as s:
        s.setup()
        yield s


def stopped_before_work(saver: DeterministicSaver, thread: str) -> Any:
    graph = build_graph().compile(checkpointer=saver, interrupt_before=["work"])
    config = {"configurable": {"thread_id": thread}}
    graph.invoke(first_input(), config)
    return graph, config


def downgrade_to_v3(dsn: str, thread: str) -> list[Send]:
    """Rewrite the thread's head as LangGraph < 0.3 stored it; return its pending Sends."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        head_id, parent_id, versions = conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id, checkpoint -> 'channel_versions' "
            "FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            (thread,),
        ).fetchone()  # type: ignore[misc]
        type_, blob = conn.execute(
            "DELETE FROM checkpoint_blobs WHERE thread_id = %s AND checkpoint_ns = '' "
            "AND channel = %s AND version = %s RETURNING type, blob",
            (thread, TASKS, versions[TASKS]),
        ).fetchone()  # type: ignore[misc]
        conn.execute(
            "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint #- '{channel_versions,"
            + TASKS
            + "}' #- '{channel_values,"
            + TASKS
            + "}', '{v}', '3') "
            "WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s",
            (thread, head_id),
        )
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        serde = JsonPlusSerializer()
        sends: list[Send] = serde.loads_typed((type_, bytes(blob)))
        # The task that fanned out wrote its Sends as TASKS writes of the parent (LangGraph
        # still does): in format v < 4 those writes are where the pending Sends live.
        written = conn.execute(
            "SELECT type, blob FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = '' "
            "AND checkpoint_id = %s AND channel = %s ORDER BY task_path, task_id, idx",
            (thread, parent_id, TASKS),
        ).fetchall()
        assert [serde.loads_typed((t, bytes(b))) for t, b in written] == sends
    return sends


def test_a_v3_head_resumes_its_pending_sends(saver: DeterministicSaver, dsn: str) -> None:
    control_graph, control = stopped_before_work(saver, "v4-control")
    graph, config = stopped_before_work(saver, "v3-thread")
    sends = downgrade_to_v3(dsn, "v3-thread")
    assert [s.arg for s in sends] == [{"topic": f"part-{i}"} for i in range(3)]

    loaded = saver.get_tuple(config)
    assert loaded is not None and loaded.checkpoint["v"] == 3
    assert loaded.checkpoint["channel_values"][TASKS] == sends
    versions = loaded.checkpoint["channel_versions"]
    assert versions[TASKS] == max(v for k, v in versions.items() if k != TASKS)

    state = graph.get_state(config)
    assert state.next == control_graph.get_state(control).next == ("work", "work", "work")
    # resumed, the old thread runs its fan-out exactly as the v4 one does
    resumed, expected = graph.invoke(None, config), control_graph.invoke(None, control)
    assert resumed.keys() == expected.keys()
    assert resumed["__interrupt__"][0].value == expected["__interrupt__"][0].value
    assert {k: v for k, v in resumed.items() if k != "__interrupt__"} == {
        k: v for k, v in expected.items() if k != "__interrupt__"
    }
    assert set(graph.get_state(config).values["results"]) >= {f"did part-{i}" for i in range(3)}


async def test_async_reads_fold_the_same_sends(saver: DeterministicSaver, dsn: str) -> None:
    stopped_before_work(saver, "v3-async")
    sends = downgrade_to_v3(dsn, "v3-async")
    config = {"configurable": {"thread_id": "v3-async"}}
    loaded = await saver.aget_tuple(config)
    assert loaded is not None and loaded.checkpoint["channel_values"][TASKS] == sends
    listed = [t async for t in saver.alist(config, limit=1)]
    assert listed[0].checkpoint["channel_values"][TASKS] == sends


def test_a_global_list_folds_the_sends_of_every_thread(saver: DeterministicSaver, dsn: str) -> None:
    """list(None, ...) returns checkpoints of many threads: each v3 checkpoint gets the
    sends of its own parent, in its own thread (the peer reads the first row's thread's
    only)."""
    expected = {}
    for thread in ("v3-global-a", "v3-global-b"):
        stopped_before_work(saver, thread)
        expected[thread] = downgrade_to_v3(dsn, thread)
    # the copy keeps the checkpoint ids: the same parent id in two threads
    saver.copy_thread("v3-global-a", "v3-global-copy")
    expected["v3-global-copy"] = expected["v3-global-a"]
    heads = [
        t
        for t in saver.list(None, filter={"source": "loop"})
        if t.config["configurable"]["thread_id"] in expected and t.checkpoint["v"] == 3
    ]
    assert sorted(t.config["configurable"]["thread_id"] for t in heads) == sorted(expected)
    for t in heads:
        assert (
            t.checkpoint["channel_values"].get(TASKS)
            == expected[t.config["configurable"]["thread_id"]]
        )
