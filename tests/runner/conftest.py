"""Fixtures: a real restate-server per replay regime, with our service registered.

restate-server comes from npm (see restate_server.py). If it cannot be had, the tests that
need it skip with the reason, unless LGD_REQUIRE_RESTATE=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .restate_server import RestateEnv, RestateUnavailable, ensure_binary

REGIMES = {"forced-replay": True, "no-replay": False}


@pytest.fixture(scope="session")
def restate_binary() -> Path:
    try:
        return ensure_binary()
    except RestateUnavailable as exc:
        if os.environ.get("LGD_REQUIRE_RESTATE") == "1":
            pytest.fail(f"LGD_REQUIRE_RESTATE=1 but restate-server is unavailable: {exc}")
        pytest.skip(f"restate-server unavailable: {exc}")


class _Envs:
    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.envs: dict[str, RestateEnv] = {}

    def get(self, regime: str) -> RestateEnv:
        if regime not in self.envs:
            self.envs[regime] = RestateEnv(self.binary, forced_replay=REGIMES[regime]).start()
        return self.envs[regime]

    def close(self) -> None:
        for env in self.envs.values():
            env.stop()


@pytest.fixture(scope="session")
def restate_envs(restate_binary: Path) -> Iterator[_Envs]:
    envs = _Envs(restate_binary)
    try:
        yield envs
    finally:
        envs.close()


@pytest.fixture(params=sorted(REGIMES))
def restate_env(request: pytest.FixtureRequest, restate_envs: _Envs) -> RestateEnv:
    return restate_envs.get(request.param)
