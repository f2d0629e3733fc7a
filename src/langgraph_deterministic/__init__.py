"""langgraph-deterministic: make LangGraph agents safe to retry and safe to replay."""

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    IncompatibleLangGraphError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    SchemaNotReadyError,
    SerializationError,
)

__all__ = [
    "ConcurrentRunError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DeterministicError",
    "DeterministicSaver",
    "IncompatibleLangGraphError",
    "RunIdRequiredError",
    "RunInputMismatchError",
    "RunSupersededError",
    "SchemaNotReadyError",
    "SerializationError",
    "run_config",
]
