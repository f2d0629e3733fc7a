"""Real orchestrator servers for these tests: a Temporal dev server and a Redis broker,
each started once per session on a free loopback port (tests/orchestrators/servers.py).

Unavailable binaries skip the tests that need them, with the reason, unless
``LGD_REQUIRE_ORCHESTRATORS=1`` (set by .ci/run), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from tests.orchestrators.servers import RedisServer, ServerUnavailable, TemporalDevServer


def _unavailable(exc: Exception) -> None:
    if os.environ.get("LGD_REQUIRE_ORCHESTRATORS") == "1":
        pytest.fail(f"LGD_REQUIRE_ORCHESTRATORS=1 but {exc}")
    pytest.skip(str(exc))


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[TemporalDevServer]:
    try:
        server = TemporalDevServer().start()
    except ServerUnavailable as exc:
        _unavailable(exc)
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer().start()
    except ServerUnavailable as exc:
        _unavailable(exc)
        raise
    try:
        yield server
    finally:
        server.stop()
