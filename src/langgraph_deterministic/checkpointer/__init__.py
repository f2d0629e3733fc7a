"""The Postgres checkpointer: ``DeterministicSaver``."""

from langgraph_deterministic._serde import SafeSerializer
from langgraph_deterministic.checkpointer.saver import DeterministicSaver, RunIdPolicy
from langgraph_deterministic.errors import PruneRefusedError

__all__ = ["DeterministicSaver", "PruneRefusedError", "RunIdPolicy", "SafeSerializer"]
