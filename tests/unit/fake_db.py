"""An in-memory stand-in for Postgres that drives the saver's sans-I/O core.

The core's operations are generators that yield :class:`~Batch` es and receive one
result per statement (see ``_db/batch.py``). :class:`FakeDb` answers them from
handlers keyed by the name of the query each statement runs (its ``-- name:`` block in
``sql/queries.sql``), records every batch, and raises what a handler returns as an
exception, so a test can feed canned rows and guard errors (``LG409``-``LG413``) to the
very code the sync and async drivers run, without a server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_deterministic._db.batch import Batch, Operation, Results, Statement, run
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer import _statements
from langgraph_deterministic.checkpointer._rows import Codec

CODEC = Codec(JsonPlusSerializer())
#: A fragment a composed block names, filled in before the statement is sent.
_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")

Handler = Callable[[Any], Any]


def query_name(sql: str) -> str:
    """The ``queries.sql`` block a statement comes from (or ``LISTEN``/``UNLISTEN``)."""
    if sql.startswith(("LISTEN ", "UNLISTEN ")):
        return sql.split(" ", 1)[0].lower()
    # guarded_write(s) and riding_write(s) as sent: one template, with or without its
    # {lease_probe} (_statements._block)
    composed = ("guarded_write", "guarded_writes", "riding_write", "riding_writes")
    blocks = {**queries(), **{name: _statements._block(name) for name in composed}}
    for name, text in blocks.items():
        if sql == text:
            return name
    if "FROM (SELECT c.thread_id" in sql:
        return "list"
    # Composed statements: a block with {placeholders} filled in (its text between them,
    # and after the last one, must match too, in order), or a block with a WHERE clause
    # appended (select_checkpoint). The most matching text wins.
    best, best_len = "", 0
    for name, text in blocks.items():
        pieces = _PLACEHOLDER.split(text)
        head, tail = pieces[0], pieces[-1] if len(pieces) > 1 else ""
        matches = head and sql.startswith(head) and sql.endswith(tail)
        at = len(head)
        for piece in pieces[1:-1] if matches else ():
            at = sql.find(piece, at)
            if at < 0:
                matches = False
                break
            at += len(piece)
        size = sum(map(len, pieces)) if len(pieces) > 1 else len(head)
        if matches and size > best_len:
            best, best_len = name, size
    if not best:
        raise AssertionError(f"statement from no known query block:\n{sql[:300]}")
    return best


@dataclass
class PgError(Exception):
    """What psycopg raises for a RAISE ... USING ERRCODE in our plpgsql guards."""

    sqlstate: str
    detail: str = ""
    diag: Any = field(init=False)

    def __post_init__(self) -> None:
        super().__init__(f"{self.sqlstate}: {self.detail}")
        self.diag = type("Diag", (), {"message_detail": self.detail, "message_primary": ""})()


@dataclass
class FakeDb:
    """Answers batches from ``handlers[name](params)``; unknown reads return no rows."""

    handlers: dict[str, Handler | list[Any]] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)

    def on(self, name: str, *answers: Any) -> FakeDb:
        """Answer the statements of query ``name`` with ``answers`` in turn (the last one
        repeats); an answer is rows, ``None``, an exception to raise, or a callable of the
        statement's params returning one of those."""
        self.handlers[name] = list(answers)
        return self

    def execute(self, batch: Batch) -> Results:
        self.batches.append(batch)
        if batch.wait is not None:
            return []
        results: Results = []
        for statement in batch.statements:
            name = query_name(statement.sql)
            answers = self.handlers.get(name)
            if answers is None:
                results.append([] if statement.fetch else None)
                continue
            assert isinstance(answers, list)
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if callable(answer) and not isinstance(answer, BaseException):
                answer = answer(statement.params)
            if isinstance(answer, BaseException):
                raise answer
            results.append(answer)
        return results

    def run(self, operation: Operation[Any]) -> Any:
        return run(operation, self.execute)

    # -- reading what was sent -------------------------------------------------------

    def statements(self) -> Iterator[tuple[str, Statement]]:
        for batch in self.batches:
            for statement in batch.statements:
                yield query_name(statement.sql), statement

    def names(self) -> list[list[str]]:
        """Per batch, the names of its statements (``wait`` for a NOTIFY wait)."""
        return [
            ["wait"] if b.wait is not None else [query_name(s.sql) for s in b.statements]
            for b in self.batches
        ]

    def sent(self, name: str) -> list[Statement]:
        return [s for n, s in self.statements() if n == name]


def checkpoint_row(
    checkpoint_id: str,
    *,
    thread_id: str = "t1",
    ns: str = "",
    parent: str | None = None,
    v: int = 4,
    values: dict[str, Any] | None = None,
    versions: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    blobs: Sequence[tuple[str, Any]] = (),
    writes: Sequence[tuple[str, str, Any, str, int]] = (),
) -> tuple[Any, ...]:
    """A ``select_checkpoint`` row: the checkpoint JSON, blob arrays (channel, value) and
    write arrays (task_id, channel, value, task_path, idx), as Postgres returns them."""
    checkpoint = {
        "v": v,
        "id": checkpoint_id,
        "ts": "2026-12-01T00:00:00+00:00",
        "channel_values": dict(values or {}),
        "channel_versions": dict(versions or {}),
        "versions_seen": {},
    }
    b = [(ch, *CODEC.dumps(ch, value)) for ch, value in blobs]
    w = [(task, ch, *CODEC.dumps(ch, value), path, idx) for task, ch, value, path, idx in writes]
    return (
        thread_id, ns, checkpoint_id, parent, checkpoint, dict(metadata or {}),
        [x[0] for x in b] or None, [x[1] for x in b] or None, [x[2] for x in b] or None,
        [x[0] for x in w] or None, [x[1] for x in w] or None, [x[2] for x in w] or None,
        [x[3] for x in w] or None, [x[4] for x in w] or None, [x[5] for x in w] or None,
    )  # fmt: skip


def sends_row(
    parent: str, packets: Sequence[Any], *, thread_id: str = "t1", ns: str = ""
) -> tuple[Any, ...]:
    """A ``pending_sends`` row: the TASKS writes a v < 4 parent checkpoint holds."""
    dumped = [CODEC.dumps("send", p) for p in packets]
    return (thread_id, ns, parent, [t for t, _ in dumped], [b for _, b in dumped])
