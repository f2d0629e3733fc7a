"""Database-free unit tests: every test here is marked ``unit`` (``pytest -m unit`` runs
them alone, in a few seconds, without Postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.unit)
