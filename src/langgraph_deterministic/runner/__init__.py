"""Deterministic superstep execution (see docs/deterministic-replay-on-restate.md).

``DeterministicRunner(journal=RestateJournal(ctx))`` runs a LangGraph graph inside a
Restate handler so that durable ops made by parallel nodes replay deterministically.
``restate-sdk`` is optional: it is imported only when a ``RestateJournal`` is built.
"""

from ._context import durable
from ._ordering import JournalBackend, JournalClosedError, NondeterminismError, OpScheduler
from ._restate import IncompatibleRestateError, RestateJournal
from ._runner import SUPPORTED_LANGGRAPH, DeterministicRunner, Journal

__all__ = [
    "SUPPORTED_LANGGRAPH",
    "DeterministicRunner",
    "IncompatibleRestateError",
    "Journal",
    "JournalBackend",
    "JournalClosedError",
    "NondeterminismError",
    "OpScheduler",
    "RestateJournal",
    "durable",
]
