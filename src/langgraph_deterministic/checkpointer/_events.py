"""Hooks of PostgresJournal's session (``runner/_postgres.py``) into the saver: the
context variables it sets for one runner call, and how the saver tells it what it loaded,
wrote and admitted."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from langgraph_deterministic.checkpointer.contract import HeldLease, find_recorder

#: Set by PostgresJournal's session (runner/_postgres.py) for one runner call: told of
#: every checkpoint this saver loads ("load", the id found or None) and, before it is sent,
#: of every one it writes ("put") in that call. A task running from a checkpoint its own
#: attempt created then needs no claim before its first durable op.
CHECKPOINT_EVENTS: ContextVar[Callable[[str, RunnableConfig, str | None], None] | None] = (
    ContextVar("lgd_checkpoint_events", default=None)
)


#: Set by PostgresJournal's session for one runner call: ``(attempt, admitted)``. A graph
#: run of that attempt this saver admits registers the attempt in the journal in the same
#: statement (``lgd_journal_admit_v1``); ``admitted(saver, held, asked)`` hears of it, with
#: ``held.fence_at`` and the local monotonic time the admission was sent (its answer is
#: no older). The run's first op then needs no claim of its own.
JOURNAL_ADMISSION: ContextVar[tuple[str, Callable[[Any, HeldLease, float], None]] | None] = (
    ContextVar("lgd_journal_admission", default=None)
)


def _held(config: RunnableConfig) -> HeldLease | None:
    recorder = find_recorder(config)
    return None if recorder is None else recorder.held


def _admitted(
    saver: Any,
    journal: tuple[str, Callable[[Any, HeldLease, float], None]],
    config: RunnableConfig,
    before: HeldLease | None,
    asked: float,
) -> None:
    """Tell the journal's session of an admission this load made (not of an earlier one)."""
    held = _held(config)
    if held is None or held is before or held.fence_at is None or held.attempt != journal[0]:
        return
    journal[1](saver, held, asked)


def _announce(kind: str, config: RunnableConfig, checkpoint_id: str | None) -> None:
    listener = CHECKPOINT_EVENTS.get()
    if listener is not None:
        listener(kind, config, checkpoint_id)


def _found_id(found: CheckpointTuple | None) -> str | None:
    return None if found is None else str(found.config["configurable"]["checkpoint_id"])


