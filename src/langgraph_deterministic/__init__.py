"""langgraph-deterministic: make LangGraph agents safe to retry and safe to replay."""

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.checkpointer.contract import RunRecord
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    IncompatibleLangGraphError,
    IncompatibleRestateError,
    JournalClosedError,
    MigrationError,
    MigrationLockTimeoutError,
    NondeterminismError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
    SaverClosedError,
    SchemaNotReadyError,
    SerializationError,
    ThreadBusyError,
)
from langgraph_deterministic.runner import DeterministicRunner, durable

__all__ = [
    "ConcurrentRunError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DeterministicError",
    "DeterministicRunner",
    "DeterministicSaver",
    "IncompatibleLangGraphError",
    "IncompatibleRestateError",
    "JournalClosedError",
    "MigrationError",
    "MigrationLockTimeoutError",
    "NondeterminismError",
    "RunIdRequiredError",
    "RunInputMismatchError",
    "RunRecord",
    "RunSupersededError",
    "RunUnfinishedError",
    "SaverClosedError",
    "SchemaNotReadyError",
    "SerializationError",
    "ThreadBusyError",
    "durable",
    "run_config",
]
