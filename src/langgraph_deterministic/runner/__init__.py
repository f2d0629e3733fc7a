"""Durable ops inside LangGraph nodes (see docs/deterministic-replay-on-restate.md and
docs/durable-ops-without-restate.md).

``DeterministicRunner(journal=RestateJournal(ctx))`` runs a LangGraph graph inside a
Restate handler so that durable ops made by parallel nodes replay deterministically;
``DeterministicRunner(journal=PostgresJournal(saver))`` journals them in Postgres, next to
the checkpoints, with no external engine. ``restate-sdk`` is optional: it is imported only
when a ``RestateJournal`` is built; ``langchain`` only when ``DurableMiddleware`` is used.
"""

import importlib.util
from typing import TYPE_CHECKING, Any

from ._context import durable, durable_sync, idempotency_key
from ._ordering import JournalBackend, JournalClosedError, NondeterminismError, OpScheduler
from ._postgres import JournalStats, PostgresJournal
from ._restate import IncompatibleRestateError, RestateJournal
from ._runner import SUPPORTED_LANGGRAPH, DeterministicRunner, Journal, KeyedJournal

if TYPE_CHECKING:
    from ._middleware import DurableMiddleware as DurableMiddleware


def __getattr__(name: str) -> Any:
    if name == "DurableMiddleware":  # needs langchain (create_agent's package)
        try:
            from ._middleware import DurableMiddleware
        except ModuleNotFoundError as exc:
            from langgraph_deterministic.errors import ConfigurationError

            raise ConfigurationError(
                f"DurableMiddleware needs langchain, create_agent's package ({exc}). Fix: "
                "pip install 'langgraph-deterministic[agents]' (or langchain>=1.0)."
            ) from exc
        return DurableMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: ``from langgraph_deterministic.runner import *`` works without langchain too
_AGENTS = importlib.util.find_spec("langchain") is not None


__all__ = [
    "SUPPORTED_LANGGRAPH",
    "DeterministicRunner",
    *(["DurableMiddleware"] if _AGENTS else []),
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
]
