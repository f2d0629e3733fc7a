"""The LG412 chain against real Postgres: a run's attempt that delivers its Command a
second time (on a checkpoint the same run wrote after applying it) is refused, and the
saver bars that attempt from the checkpoint (the child slot ``refused:<attempt>`` in
``lgd_chain``): everything it writes there afterwards is refused too, while any other
attempt or run continues the checkpoint as usual. Each refusal leaves the tables as they
were. The calls are the saver's own, with the configs a running graph passes it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic._compat.langgraph import NULL_TASK_ID
from langgraph_deterministic.checkpointer._keys import ATTEMPT_KEY, GRAPH_RUN_MARKER
from langgraph_deterministic.errors import ConcurrentRunError, RunSupersededError

THREAD = "refused"


@pytest.fixture(scope="module")
def saver(dsn: str) -> Any:
    with DeterministicSaver(dsn) as s:
        s.setup()
        yield s


def config(attempt: str, checkpoint_id: str | None, run: str = "r1") -> Any:
    configurable: dict[str, Any] = {
        "thread_id": THREAD, "checkpoint_ns": "", GRAPH_RUN_MARKER: object(),
        ATTEMPT_KEY: attempt,
    }  # fmt: skip
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable, "metadata": {"run_id": run}}


def checkpoint(checkpoint_id: str) -> Any:
    cp = empty_checkpoint()
    cp["id"] = checkpoint_id
    return cp


def snapshot(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {
            table: conn.execute(
                f"SELECT {cols} FROM {table} WHERE thread_id = %s ORDER BY 1, 2", (THREAD,)
            ).fetchall()
            for table, cols in [
                ("checkpoints", "checkpoint_id, parent_checkpoint_id"),
                ("checkpoint_writes", "checkpoint_id, task_id, channel"),
                ("lgd_chain", "parent_checkpoint_id, checkpoint_id, run_id, attempt"),
            ]
        }


def test_a_refused_attempt_stores_nothing_more_and_others_continue(
    saver: DeterministicSaver, dsn: str
) -> None:
    # Attempt A1 of run r1 writes c1 (the thread's first checkpoint) and c2 after it.
    saver.put(config("A1", None), checkpoint("00000001"), {"source": "input", "step": -1}, {})
    saver.put(config("A1", "00000001"), checkpoint("00000002"), {"source": "loop", "step": 0}, {})
    before = snapshot(dsn)

    # A2, another attempt of r1, delivers its Command at c2, which r1 wrote itself: LG412.
    with pytest.raises(RunSupersededError, match="duplicate delivery"):
        saver.put_writes(config("A2", "00000002"), [("__resume__", "yes")], NULL_TASK_ID)
    after = snapshot(dsn)
    barred = ("00000002", "refused:A2", "r1", "A2")
    assert after["lgd_chain"] == [*before["lgd_chain"], barred]
    assert after["checkpoints"] == before["checkpoints"]
    assert after["checkpoint_writes"] == before["checkpoint_writes"]  # the Command is not stored

    # Everything A2 computed from the Command it applied in memory is refused at c2:
    # a task's pending writes (LG412 from lgd_refuse_writes) and the next checkpoint.
    with pytest.raises(RunSupersededError):
        saver.put_writes(config("A2", "00000002"), [("log", "from the duplicate")], "task-1", "p")
    with pytest.raises(ConcurrentRunError):
        saver.put(config("A2", "00000002"), checkpoint("00000003"), {"source": "loop", "step": 1}, {})
    assert snapshot(dsn) == after

    # Another attempt (the genuine retry, A3) writes at c2 and continues it: it takes the
    # slot held for the refused attempt.
    saver.put_writes(config("A3", "00000002"), [("log", "real")], "task-1", "p")
    saver.put(config("A3", "00000002"), checkpoint("00000004"), {"source": "loop", "step": 1}, {})
    final = snapshot(dsn)
    assert ("00000002", "00000004", "r1", "A3") in final["lgd_chain"]
    assert ("00000002", "refused:A2") not in {r[:2] for r in final["lgd_chain"]}
    assert ("00000004", "00000002") in final["checkpoints"]
    assert ("00000002", "task-1", "log") in final["checkpoint_writes"]
    run = saver.get_run(THREAD, "r1")
    assert run is not None and run.last_checkpoint_id == "00000004"

    # A2, still around, is now a zombie behind A3: refused as one.
    with pytest.raises(ConcurrentRunError):
        saver.put(config("A2", "00000002"), checkpoint("00000005"), {"source": "loop", "step": 1}, {})
    with pytest.raises(ConcurrentRunError):
        saver.put_writes(config("A2", "00000002"), [("log", "late")], "task-2", "p")
    assert snapshot(dsn) == final
