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
    JournaledOpError,
    JournalLimitError,
    MigrationError,
    MigrationLockTimeoutError,
    NondeterminismError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    SaverClosedError,
    SchemaNotReadyError,
    SerializationError,
)
from langgraph_deterministic.runner import (
    DeterministicRunner,
    PostgresJournal,
    durable,
    durable_sync,
    idempotency_key,
)

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
    "JournalLimitError",
    "JournaledOpError",
    "MigrationError",
    "MigrationLockTimeoutError",
    "NondeterminismError",
    "PostgresJournal",
    "RunIdRequiredError",
    "RunInputMismatchError",
    "RunRecord",
    "RunSupersededError",
    "SaverClosedError",
    "SchemaNotReadyError",
    "SerializationError",
    "durable",
    "durable_sync",
    "idempotency_key",
    "run_config",
]
