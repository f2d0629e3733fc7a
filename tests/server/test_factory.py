"""langgraph_deterministic.server without a server: the factory's settings and the run-id
rules, on graph calls shaped like the server's (its run id in configurable and metadata,
no callbacks). Cheap: runs in the default suite whether or not the server is installed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic.errors import ConfigurationError, RunInputMismatchError
from langgraph_deterministic.server import (
    RECORDER_ENV,
    ServerSaver,
    checkpointer,
)


def _add(a: list[str], b: list[str]) -> list[str]:
    return a + b


class State(TypedDict):
    items: Annotated[list[str], _add]


def _graph(saver: ServerSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", lambda s: {"items": ["step"]})
    builder.add_edge(START, "step")
    return builder.compile(checkpointer=saver)


def server_config(thread: str, key: Any = None) -> dict[str, Any]:
    """A run's config as langgraph-api builds it: a fresh server run id per request."""
    run = str(uuid.uuid4())
    metadata: dict[str, Any] = {"run_id": run, "assistant_id": "a"}
    if key is not None:
        metadata["idempotency_key"] = key
    return {"configurable": {"thread_id": thread, "run_id": run}, "metadata": metadata}


@pytest.fixture
def server_env(db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in ("DATABASE_URI", "POSTGRES_URI", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URI", ":memory:")  # langgraph dev's own: skipped
    monkeypatch.setenv("POSTGRES_URI", db)
    yield db
    # The configure hook stays registered; without its variable it creates nothing.
    os.environ.pop(RECORDER_ENV, None)


async def test_the_factory_reads_its_settings(
    server_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LGD_POOL_MAX_SIZE", "7")
    monkeypatch.setenv("LGD_LEASE_TTL", "12.5")
    monkeypatch.setenv("LGD_RUN_ID_POLICY", "warn")
    monkeypatch.setenv("LGD_MULTITASK_STRATEGY", "reject")
    async with checkpointer() as saver:
        assert isinstance(saver, ServerSaver)
        assert saver.lease_ttl == 12.5 and saver.run_id_policy == "warn"
        assert saver._pool_max_size == 7 and saver.multitask_strategy == "reject"
        assert await saver.aapplied_migrations()
    for name in (
        "LGD_POOL_MAX_SIZE",
        "LGD_LEASE_TTL",
        "LGD_RUN_ID_POLICY",
        "LGD_MULTITASK_STRATEGY",
    ):
        monkeypatch.delenv(name)
    async with checkpointer() as saver:
        assert (saver._pool_max_size, saver.lease_ttl, saver.run_id_policy) == (20, 30, "require")
        assert saver.multitask_strategy == "rollback"
    monkeypatch.setenv("LGD_LEASE_TTL", "soon")
    with pytest.raises(ConfigurationError, match="LGD_LEASE_TTL"):
        async with checkpointer():
            pass


async def test_the_factory_names_the_variables_when_none_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("DATABASE_URI", "POSTGRES_URI", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URI", ":memory:")
    with pytest.raises(ConfigurationError, match="POSTGRES_URI"):
        async with checkpointer():
            pass


async def test_server_shaped_runs_keep_the_contract(server_env: str) -> None:
    async with checkpointer() as saver:
        graph = _graph(saver)
        thread = str(uuid.uuid4())
        first = await graph.ainvoke({"items": ["a"]}, server_config(thread, "k"))
        # A resend: a fresh server run id, the same key and input: applied once.
        assert await graph.ainvoke({"items": ["a"]}, server_config(thread, "k")) == first
        assert first == {"items": ["a", "step"]}
        with pytest.raises(RunInputMismatchError):
            await graph.ainvoke({"items": ["b"]}, server_config(thread, "k"))
        # Without a key the server's run id is the run id: a new run.
        out = await graph.ainvoke({"items": ["c"]}, server_config(thread))
        assert out == {"items": ["a", "step", "c", "step"]}
        with pytest.raises(ConfigurationError, match="idempotency_key"):
            await graph.ainvoke({"items": ["d"]}, server_config(thread, 5))
        # A state update without a run id gets one minted for it.
        await graph.aupdate_state({"configurable": {"thread_id": thread}}, {"items": ["u"]})
        runs = [r async for r in saver.alist({"configurable": {"thread_id": thread}}, limit=1)]
        assert str(runs[0].metadata["run_id"]).startswith("update:")


async def test_the_hook_adds_one_recorder_to_a_root_call(server_env: str) -> None:
    from langchain_core.callbacks.manager import AsyncCallbackManager

    from langgraph_deterministic.checkpointer._recorder import RunInputRecorder

    async with checkpointer():
        bare = AsyncCallbackManager.configure(inheritable_callbacks=None)
        assert [type(h).__name__ for h in bare.handlers] == ["_HookRecorder"]
        mine = RunInputRecorder()
        given = AsyncCallbackManager.configure(inheritable_callbacks=[mine])
        assert [h for h in given.handlers if isinstance(h, RunInputRecorder)] == [mine]
    os.environ.pop(RECORDER_ENV)
    off = AsyncCallbackManager.configure(inheritable_callbacks=None)
    assert not [h for h in off.handlers if isinstance(h, RunInputRecorder)]
