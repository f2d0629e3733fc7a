"""The Postgres checkpointer: ``DeterministicSaver``."""

from langgraph_deterministic.checkpointer._core import PruneRefusedError
from langgraph_deterministic.checkpointer.saver import DeterministicSaver, RunIdPolicy

__all__ = ["DeterministicSaver", "PruneRefusedError", "RunIdPolicy"]
