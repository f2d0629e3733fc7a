"""Every error this package raises on purpose derives from :class:`DeterministicError`.

Each message names what went wrong and how to fix it. An operation that raises one of
these has written nothing: checks happen before, or inside the same transaction as, the
write they guard.
"""

from __future__ import annotations


class DeterministicError(Exception):
    """Base class of every error langgraph-deterministic raises on purpose."""


class ConfigurationError(DeterministicError, ValueError):
    """The saver or runner was built or called with arguments it cannot use."""


class DatabaseUnavailableError(DeterministicError, ConnectionError):
    """Postgres could not be reached with the connection info given."""


class SchemaNotReadyError(DeterministicError):
    """The checkpoint tables are missing or older than this version of the package."""


class SerializationError(DeterministicError, TypeError):
    """A channel value or a pending write could not be serialised."""


class IncompatibleLangGraphError(DeterministicError, ImportError):
    """The installed LangGraph lacks an extension point this package relies on."""


class RunIdRequiredError(DeterministicError):
    """A checkpoint write carried no ``metadata.run_id`` under run_id_policy="require"."""


class RunInputMismatchError(DeterministicError):
    """A retry reused a run_id with an input different from the one it first ran with."""


class RunSupersededError(DeterministicError):
    """A late retry of a run arrived after a later run had moved the thread on."""


class ConcurrentRunError(DeterministicError):
    """Another attempt of the same run (or another run) owns the thread right now."""


__all__ = [
    "ConcurrentRunError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DeterministicError",
    "IncompatibleLangGraphError",
    "RunIdRequiredError",
    "RunInputMismatchError",
    "RunSupersededError",
    "SchemaNotReadyError",
    "SerializationError",
]
