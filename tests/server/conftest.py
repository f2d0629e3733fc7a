"""The ``langgraph_server`` fixture: one real ``langgraph dev`` per test module (see
servers.py). Skips with the reason when the server packages are missing, unless
LGD_REQUIRE_SERVER=1 (CI), where that is a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.servers import LangGraphDev, ServerUnavailable, check_available, make_project


def _unavailable(exc: Exception) -> None:
    if os.environ.get("LGD_REQUIRE_SERVER") == "1":
        pytest.fail(f"LGD_REQUIRE_SERVER=1 but langgraph dev is unavailable: {exc}")
    pytest.skip(f"langgraph dev unavailable: {exc}")


@pytest.fixture(scope="module")
def server_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        check_available()
    except ServerUnavailable as exc:
        _unavailable(exc)
    return make_project(tmp_path_factory.mktemp("lgserver"))


@pytest.fixture(scope="module")
def langgraph_server(server_project: Path, db: str) -> Iterator[LangGraphDev]:
    server = LangGraphDev(server_project, db)
    try:
        server.start()
    except ServerUnavailable as exc:
        _unavailable(exc)
    try:
        yield server
    finally:
        server.stop()
