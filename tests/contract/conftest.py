"""Fixtures of the retry-contract tests (the migrated `db` is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from langgraph_deterministic.checkpointer import DeterministicSaver


@pytest.fixture
def saver(db: str) -> Iterator[DeterministicSaver]:
    """A saver with the default policy ("require")."""
    with DeterministicSaver(db) as s:
        yield s
