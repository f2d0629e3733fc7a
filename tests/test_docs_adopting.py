"""Every Python snippet of docs/how-to/adopting.md runs as written, against a real Postgres and a
real PgBouncer in transaction mode (``DSN``, ``POOLER_DSN`` and ``builder`` are given)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.checkpointer.graphs import build_graph
from tests.pgbouncer import PgBouncer

from langgraph_deterministic import DeterministicSaver

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "adopting.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_doc_has_snippets() -> None:
    assert len(SNIPPETS) >= 5


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(db: str, pgbouncer: PgBouncer, index: int) -> None:
    namespace = {"DSN": db, "POOLER_DSN": pgbouncer.dsn_for(db), "builder": build_graph()}
    exec(compile(SNIPPETS[index], f"{DOC.name}[{index}]", "exec"), namespace)
