"""langgraph-checkpoint-conformance, in full: every capability must be detected and pass."""

from __future__ import annotations

from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities
from psycopg_pool import AsyncConnectionPool

from langgraph_deterministic import DeterministicSaver


async def test_conformance_suite_passes_with_every_capability(dsn: str) -> None:
    async with DeterministicSaver(dsn, run_id_policy="off") as admin:
        await admin.asetup()

    @checkpointer_test(name="DeterministicSaver")
    async def factory() -> AsyncIterator[DeterministicSaver]:
        # A pool, as in production: the suite's concurrent calls run in parallel.
        async with AsyncConnectionPool(
            dsn, min_size=2, max_size=8, kwargs={"autocommit": True}
        ) as pool:
            yield DeterministicSaver(pool, run_id_policy="off")

    async with factory.create() as saver:
        detected = DetectedCapabilities.from_instance(saver)
    # A capability counts only where its a* method is overridden: a missing one must fail.
    assert detected.detected == ALL_CAPABILITIES, sorted(c.value for c in detected.missing)

    report = await validate(factory)
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if result is not None and not result.passed
    }
    assert report.passed_all(), failures
    ran = {
        name for name, result in report.results.items() if result is not None and result.detected
    }
    assert ran == {c.value for c in ALL_CAPABILITIES}
