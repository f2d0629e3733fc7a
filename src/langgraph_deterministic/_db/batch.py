"""The batch protocol between the sans-I/O operations (``_core``) and the drivers.

An operation is a generator: it yields a :class:`Batch` of statements, receives one
result per statement (a list of rows, or ``None``), and finally returns its value.
:func:`run` / :func:`arun` drive one with an ``execute(batch)`` the drivers supply
(``_drivers``): the sync and async APIs share every line of logic.

A batch is sent in one pipeline sync (one network round trip) and, when it writes,
inside one transaction: a write either lands whole or not at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

T = TypeVar("T")

Isolation = Literal["read committed", "repeatable read", "serializable"]


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement. ``many`` runs it once per parameter tuple (executemany)."""

    sql: str
    params: Sequence[Any] | Mapping[str, Any] | None = None
    fetch: bool = False
    many: bool = False
    # Prepared statements pay off for the hot, fixed-shape queries; statements whose
    # plan depends on array sizes (prune, delete_for_runs) are planned afresh each time.
    prepare: bool | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent together. ``atomic`` wraps them in one transaction."""

    statements: tuple[Statement, ...]
    atomic: bool = False
    isolation: Isolation | None = None
    # Statements such as CREATE INDEX CONCURRENTLY refuse to run in a transaction, and
    # in pipeline mode psycopg would wrap them in one: they are run one by one instead.
    pipeline: bool = True
    # (channel, seconds): no statement; wait up to ``seconds`` for the release of the
    # thread whose queue channel this is, holding no connection (``_waiting``); ``ticket``:
    # the waiter's queue ticket (a release wakes the first one). Returns no results.
    wait: tuple[str, float] | None = None
    ticket: int | None = None

    @classmethod
    def read(cls, sql: str, params: Any = None) -> Batch:
        return cls((Statement(sql, params, fetch=True),))

    @classmethod
    def write(cls, *statements: Statement, isolation: Isolation | None = None) -> Batch:
        return cls(tuple(statements), atomic=True, isolation=isolation)


Results = list[list[tuple[Any, ...]] | None]
Operation = Generator[Batch, Results, T]


def store(statements: Sequence[Statement]) -> Operation[None]:
    """Write ``statements`` in one transaction."""
    yield Batch.write(*statements)


def writes_first(operation: Operation[T], first: Sequence[Statement]) -> Operation[T]:
    """``operation`` with ``first`` (buffered pending writes, see ``_writebuffer``) sent
    ahead of its first batch, a write, in the same transaction: both land or neither.

    A failure of the combined batch is thrown into ``operation``, which translates it as
    its own (the writes belong to the same run and thread, so the cause is the same)."""
    try:
        batch = next(operation)
    except StopIteration as stop:
        if first:
            yield Batch.write(*first)
        return stop.value  # type: ignore[no-any-return]
    if first:
        assert batch.atomic, "writes_first: the operation must start with a write"
        batch = Batch(tuple(first) + batch.statements, atomic=True, isolation=batch.isolation)
    skip = len(first)
    while True:
        try:
            results = yield batch
        except BaseException as exc:
            try:
                batch = operation.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                batch = operation.send(results[skip:])
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        skip = 0


def run(operation: Operation[T], execute: Callable[[Batch], Results]) -> T:
    """Drive ``operation`` with a synchronous ``execute(batch) -> results``.

    A failed or interrupted batch (an error, Ctrl-C, a cancelled task: psycopg cancels
    the query and leaves the connection usable) is thrown into the operation, so it can
    clean up (release a lock) with one more batch before the error propagates.
    """
    try:
        batch = next(operation)
        while True:
            try:
                results = execute(batch)
            except BaseException as exc:  # also KeyboardInterrupt: the operation cleans up
                batch = operation.throw(exc)
            else:
                batch = operation.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(operation: Operation[T], execute: Callable[[Batch], Awaitable[Results]]) -> T:
    """:func:`run` for an async ``execute``."""
    try:
        batch = next(operation)
        while True:
            try:
                results = await execute(batch)
            except BaseException as exc:  # also CancelledError: the operation cleans up
                batch = operation.throw(exc)
            else:
                batch = operation.send(results)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
