"""Durable ops inside LangGraph nodes (see docs/explanation/deterministic-replay-on-restate.md and
docs/how-to/durable-ops-without-restate.md).

``DeterministicRunner(journal=RestateJournal(ctx))`` runs a LangGraph graph inside a
Restate handler so that durable ops made by parallel nodes replay deterministically;
``DeterministicRunner(journal=PostgresJournal(saver))`` journals them in Postgres, next to
the checkpoints, with no external engine. ``restate-sdk`` is optional: it is imported only
when a ``RestateJournal`` is built; ``langchain`` only when ``DurableMiddleware`` is used.
"""

from typing import TYPE_CHECKING, Any

from ._context import durable, durable_sync, idempotency_key
from ._ordering import JournalBackend, JournalClosedError, NondeterminismError, OpScheduler
from ._postgres import JournalStats, PostgresJournal, is_transient
from ._restate import IncompatibleRestateError, RestateJournal
from ._runner import SUPPORTED_LANGGRAPH, DeterministicRunner, Journal, KeyedJournal

if TYPE_CHECKING:
    from ._middleware import DurableMiddleware as DurableMiddleware

# DurableMiddleware is imported on first use (it needs the [agents] extra), so it is not in
# __all__: ``from langgraph_deterministic.runner import *`` works without langchain.


def __getattr__(name: str) -> Any:
    if name == "DurableMiddleware":  # needs langchain (create_agent's package)
        try:
            from ._middleware import DurableMiddleware
        except ImportError as exc:  # no langchain, or one older than 1.0
            from langgraph_deterministic.errors import MissingExtraError

            raise MissingExtraError(
                f"DurableMiddleware needs langchain>=1.0, create_agent's package ({exc}). "
                "Fix: pip install 'langgraph-deterministic[agents]'."
            ) from exc
        return DurableMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SUPPORTED_LANGGRAPH",
    "DeterministicRunner",
    "IncompatibleRestateError",
    "Journal",
    "JournalBackend",
    "JournalClosedError",
    "JournalStats",
    "KeyedJournal",
    "NondeterminismError",
    "OpScheduler",
    "PostgresJournal",
    "RestateJournal",
    "durable",
    "durable_sync",
    "idempotency_key",
    "is_transient",
]
