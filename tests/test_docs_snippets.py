"""Every Python snippet in docs/ runs, as written, against a real Postgres.

The snippets of a page run in order in one namespace, on a fresh database
(``$DATABASE_URL`` points at it, and the placeholder ``"postgresql://..."`` is replaced by
it). A snippet may use the names a reader is assumed to have (``builder``, ``inputs``,
``saver``, ``graph``, ``model``, ...): :func:`givens` provides them, as real objects (a
real graph, a fake chat model from langchain_core). Top-level ``await`` runs on an event
loop. Pages whose snippets another test runs with a richer setup are listed in
``RUN_ELSEWHERE``. A block preceded by ``<!-- not run: REASON -->`` is skipped: only for
code that needs an external server the tests do not have, and the reason must say so.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from devtools.postgres import create_database, database_name, drop_database

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_ELSEWHERE = {
    "how-to/adopting.md": "tests/test_docs_adopting.py",  # needs PgBouncer
    "how-to/migrations.md": "tests/test_docs_migrations.py",  # asserts the printed plan
    "how-to/going-back.md": "tests/ops/test_docs_going_back.py",  # its CLI steps, then Python
    "how-to/high-availability.md": "tests/test_docs_high_availability.py",  # a real failover
    "how-to/retention.md": "tests/ops/test_retention.py",  # on threads aged by the clock
    # whole files and a worker command, run against a real Temporal / Celery + Redis
    "how-to/temporal.md": "tests/orchestrators/test_docs_pages.py",
    "how-to/celery.md": "tests/orchestrators/test_docs_pages.py",
    # the entry point of a Job, run as the Job runs it beside a graph module of the test's
    "how-to/retry-loops.md": "tests/orchestrators/test_retry_loops_doc.py",
    # its client's calls, against a real langgraph dev serving the page's langgraph.json
    "how-to/langgraph-server.md": "tests/server/test_langgraph_server.py",
}
_BLOCK = re.compile(r"(<!-- not run: ([^>]*?) -->\s*\n)?```python\n(.*?)```", re.S)


def blocks(page: Path) -> list[tuple[str | None, str]]:
    """(reason it is not run or None, code) for every python block of a page."""
    return [(m.group(2), m.group(3)) for m in _BLOCK.finditer(page.read_text("utf-8"))]


PAGES = sorted(
    p.relative_to(DOCS).as_posix()
    for p in DOCS.rglob("*.md")
    if blocks(p) and p.relative_to(DOCS).as_posix() not in RUN_ELSEWHERE
)


def test_every_page_with_snippets_is_run_somewhere() -> None:
    for page in RUN_ELSEWHERE.values():
        assert (ROOT / page).exists(), page
    for path in DOCS.rglob("*.md"):
        for reason, _ in blocks(path):
            if reason is not None:  # only an external server excuses a block
                assert "server" in reason or "service" in reason, (path, reason)
    assert "tutorials/quickstart.md" in PAGES and "reference/errors.md" in PAGES
    # `py` fences are the API page's signatures (devtools/reference.py), never a snippet
    for path in DOCS.rglob("*.md"):
        if path.relative_to(DOCS).as_posix() != "reference/api.md":
            assert "```py\n" not in path.read_text("utf-8"), path


class ChatState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def _chat_builder() -> StateGraph[Any]:
    """One node that answers the last message."""

    def reply(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"re: {state['messages'][-1].content}")]}

    builder = StateGraph(ChatState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


def givens(dsn: str, stack: list[Any]) -> dict[str, Any]:
    """What the snippets assume the reader has: real objects, on the page's database."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import HumanMessage
    from psycopg_pool import ConnectionPool

    from langgraph_deterministic import DeterministicSaver, run_config

    pool = ConnectionPool(dsn, kwargs={"autocommit": True}, open=True, min_size=1, max_size=4)
    stack.append(pool)
    saver = DeterministicSaver(pool)
    saver.setup()
    stack.append(saver)
    builder = _chat_builder()
    thread_id, run_id = f"docs-{uuid.uuid4().hex[:8]}", "docs-run-1"

    async def fetch(url: str) -> str:
        return f"page of {url}"

    async def summarise(text: str) -> str:
        return text[:20]

    async def classify(text: str) -> str:
        return "news"

    class Payments:
        def charge(self, order_id: str, cents: int, idempotency_key: str) -> str:
            return f"receipt-{idempotency_key[-6:]}"

    return {
        "asyncio": asyncio,
        "dsn": dsn,
        "pool": pool,
        "saver": saver,
        "builder": builder,
        "graph": builder.compile(checkpointer=saver),
        "inputs": {"messages": [HumanMessage(content="hi")]},
        "thread_id": thread_id,
        "run_id": run_id,
        "config": run_config(thread_id, "docs-run-config"),
        "model": GenericFakeChatModel(messages=iter([AIMessage(content="hello")] * 10)),
        "tools": [],
        "payments": Payments(),
        "send_receipt": lambda email, receipt: None,
        "fetch": fetch,
        "summarise": summarise,
        "classify": classify,
    }


@pytest.fixture
def page_db(pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_docs_snippets")
    monkeypatch.setenv("DATABASE_URL", dsn)
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def run_snippet(code: str, name: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, namespace))
    else:
        exec(compiled, namespace)


@pytest.mark.parametrize("page", PAGES)
def test_page_snippets_run(page: str, page_db: str) -> None:
    stack: list[Any] = []
    namespace = givens(page_db, stack)
    try:
        for index, (reason, code) in enumerate(blocks(DOCS / page)):
            if reason is None:
                code = code.replace('"postgresql://..."', repr(page_db))
                run_snippet(code, f"docs/{page}[{index}]", namespace)
    finally:
        for obj in reversed(stack):
            obj.close()


def test_quickstart_shows_what_it_says(page_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The quickstart's printed results are the ones its comments announce."""
    namespace: dict[str, Any] = {}
    for index, (_, code) in enumerate(blocks(DOCS / "tutorials" / "quickstart.md")):
        run_snippet(code, f"quickstart[{index}]", namespace)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "attempt 1 failed: mail server unreachable", out
    assert out[1:4] == ["['charged order A-1001', 'receipt sent']", "['A-1001']", "done 2"], out
    assert "run id" in out[4] and out[5] == "False", out
