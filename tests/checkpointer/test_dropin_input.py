"""Bad input is refused up front, with our error, nothing written: ids too long for a btree
entry, and a graph run addressed at a checkpoint that does not exist (or was pruned), which
would otherwise start an empty conversation that names the missing checkpoint as parent."""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig

from langgraph_deterministic import ConfigurationError, DeterministicSaver, run_config
from langgraph_deterministic.checkpointer._ids import MAX_KEY_BYTES

from .graphs import build_graph, first_input


def _random(nbytes: int) -> str:
    """Incompressible (Postgres compresses long index entries; random hex defeats it)."""
    return secrets.token_hex(nbytes // 2)


def _stored(db: str, thread: str) -> tuple[int, int, int]:
    with psycopg.connect(db) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s),"
            " (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s),"
            " (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %(t)s)",
            {"t": thread},
        ).fetchone()
    assert counts is not None
    return counts


@pytest.mark.parametrize("policy", ["require", "off"])
def test_run_id_too_long_is_refused_before_anything_is_written(db: str, policy: str) -> None:
    thread = f"long-run-{policy}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:  # type: ignore[arg-type]
        graph = build_graph().compile(checkpointer=saver)
        with pytest.raises(ConfigurationError, match="too long to index"):
            graph.invoke(first_input(), run_config(thread, _random(3000)))
    assert _stored(db, thread) == (0, 0, 0)


def test_thread_id_too_long_is_refused(db: str) -> None:
    thread = _random(MAX_KEY_BYTES + 2)
    with DeterministicSaver(db) as saver:
        graph = build_graph().compile(checkpointer=saver)
        with pytest.raises(ConfigurationError, match=r"thread_id \d+ bytes"):
            graph.invoke(first_input(), run_config(thread, "r1"))
    assert _stored(db, thread) == (0, 0, 0)


async def test_a_direct_write_with_a_long_run_id_is_refused(db: str) -> None:
    thread = "long-direct"
    config: RunnableConfig = {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": "x"},
        "metadata": {"run_id": _random(2500)},
    }
    async with DeterministicSaver(db, run_id_policy="off") as saver:
        with pytest.raises(ConfigurationError, match="too long to index"):
            await saver.aput_writes(config, [("messages", "hi")], "task")
    assert _stored(db, thread) == (0, 0, 0)


def test_long_ids_within_the_limit_are_stored(db: str) -> None:
    """The limit is not stricter than it must be: ids close to it index fine."""
    budget = MAX_KEY_BYTES // 2
    thread, run = _random(budget), _random(budget)
    with DeterministicSaver(db) as saver:
        graph = build_graph().compile(checkpointer=saver)
        graph.invoke(first_input(), run_config(thread, run))
        assert saver.get_run(thread, run) is not None
    assert _stored(db, thread)[0] > 0


def _history(saver: DeterministicSaver, thread: str) -> list[Any]:
    return [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": thread}})]


@pytest.mark.parametrize("policy", ["require", "warn", "off"])
def test_graph_run_from_a_missing_checkpoint_is_refused(db: str, policy: str) -> None:
    thread = f"missing-{policy}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:  # type: ignore[arg-type]
        graph = build_graph().compile(checkpointer=saver)
        graph.invoke(first_input(), run_config(thread, "r1"))
        before = _history(saver, thread)
        missing = str(uuid.uuid4())
        with pytest.raises(ConfigurationError, match=f"Checkpoint {missing} does not exist"):
            graph.invoke(first_input(), run_config(thread, "r2", checkpoint_id=missing))
        assert _history(saver, thread) == before
        # Outside a graph run, reading a missing checkpoint still just finds nothing.
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_id": missing}}
        assert saver.get_tuple(config) is None


def test_graph_run_from_a_pruned_checkpoint_is_refused(db: str) -> None:
    thread = "pruned"
    with DeterministicSaver(db, run_id_policy="off") as saver:
        graph = build_graph().compile(checkpointer=saver)
        graph.invoke(first_input(), run_config(thread, "r1"))
        oldest = _history(saver, thread)[-1]
        saver.prune([thread], strategy="keep_latest")
        kept = _history(saver, thread)
        assert oldest not in kept
        with pytest.raises(ConfigurationError, match="pruned"):
            graph.invoke(first_input(), run_config(thread, "r2", checkpoint_id=oldest))
        assert _history(saver, thread) == kept
