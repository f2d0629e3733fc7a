"""The sync API, with the conformance suite's full coverage.

The suite only calls the async ``a*`` methods, so each is pointed at the matching sync
method (run in a worker thread, as a sync LangGraph graph would call it). Every test of
the suite then exercises put/list/get_tuple/... of the sync API and its sync driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities
from psycopg import Connection
from psycopg_pool import ConnectionPool

from langgraph_deterministic import DeterministicSaver


class SyncThroughAsync(BaseCheckpointSaver[str]):
    """Routes each async method of the protocol to the sync method of ``inner``."""

    def __init__(self, inner: DeterministicSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.inner.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(
            lambda: list(self.inner.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.inner.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.inner.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.inner.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.inner.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.inner.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.inner.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        return self.inner.get_next_version(current, channel)


@pytest.fixture(scope="module")
def ready(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@pytest.mark.parametrize("source", ["pool", "connection", "dsn"])
async def test_sync_api_passes_the_conformance_suite(ready: str, source: str) -> None:
    @checkpointer_test(name=f"DeterministicSaver sync API over a {source}")
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        if source == "pool":
            with ConnectionPool(ready, max_size=4, kwargs={"autocommit": True}) as pool:
                yield SyncThroughAsync(DeterministicSaver(pool, run_id_policy="off"))
        elif source == "connection":
            with Connection.connect(ready, autocommit=True) as conn:
                yield SyncThroughAsync(DeterministicSaver(conn, run_id_policy="off"))
        else:
            with DeterministicSaver(ready, run_id_policy="off") as saver:
                yield SyncThroughAsync(saver)

    async with factory.create() as saver:
        assert DetectedCapabilities.from_instance(saver).detected == ALL_CAPABILITIES
    report = await validate(factory)
    assert report.passed_all(), {
        name: r.failures for name, r in report.results.items() if r is not None and not r.passed
    }


def test_sync_delta_history_matches_the_generic_walk(ready: str) -> None:
    """Our one-query walk returns what BaseCheckpointSaver's get_tuple walk returns."""
    from langgraph.checkpoint.base import empty_checkpoint

    with DeterministicSaver(ready, run_id_policy="off") as saver:
        thread = "delta-sync"
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        version: str | None = None
        for step in range(6):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = f"1ef00000-0000-6000-8000-{step:012d}"
            version = saver.get_next_version(version, None)
            if step == 2:  # a stored value: the walk for "log" stops here
                checkpoint["channel_values"] = {"log": ["seed"], "n": step}
            else:
                checkpoint["channel_values"] = {"n": step}
            checkpoint["channel_versions"] = {"log": version, "n": version}
            config = saver.put(config, checkpoint, {"step": step}, {"log": version, "n": version})
            saver.put_writes(config, [("log", f"w{step}a"), ("log", f"w{step}b")], f"t{step}", "~")
            saver.put_writes(config, [("other", step)], f"u{step}", "")
        ours = saver.get_delta_channel_history(config=config, channels=["log", "n", "missing"])
        generic = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=config, channels=["log", "n", "missing"]
        )
        assert ours == generic
        assert ours["log"]["seed"] == ["seed"]
        assert [w[2] for w in ours["log"]["writes"]] == [
            "w2a", "w2b", "w3a", "w3b", "w4a", "w4b"
        ]  # fmt: skip
