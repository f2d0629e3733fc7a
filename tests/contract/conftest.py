"""Fixtures of the retry-contract tests: one migrated database per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from langgraph_deterministic.checkpointer import DeterministicSaver


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    """A fresh database with every migration applied."""
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@pytest.fixture
def saver(db: str) -> Iterator[DeterministicSaver]:
    """A saver with the default policy ("require")."""
    with DeterministicSaver(db) as s:
        yield s
