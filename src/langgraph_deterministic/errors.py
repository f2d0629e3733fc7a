"""Every error this package raises on purpose derives from :class:`DeterministicError`.

Each message names what went wrong and how to fix it. An operation that raises one of
these has written nothing: checks happen before, or inside the same transaction as, the
write they guard (a migration or an uninstall keeps the steps before the one that failed).

Each class says whether retrying the same call can succeed (``retryable``): a transient
error (the database was unreachable, another attempt held the thread or moved it first) is
worth retrying with the same run id; a permanent one (a wrong run id or input, a missing
migration, a bug in node code) fails the same way every time, so an orchestrator should
stop retrying and surface it. :func:`is_retryable` reads it for any exception.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DeterministicError(Exception):
    """Base class of every error langgraph-deterministic raises on purpose."""

    retryable: ClassVar[bool] = False
    """Whether retrying the same call (same run id, same input) can succeed."""


class ConfigurationError(DeterministicError, ValueError):
    """The saver or runner was built or called with arguments it cannot use. Fix: the
    message names the argument and what it accepts."""


class DatabaseUnavailableError(DeterministicError, ConnectionError):
    """Postgres could not be reached (refused, timed out, the connection dropped), is
    starting up, shutting down or in recovery, has no connection slot free, no pooled
    connection came free in time, the server took no writes (a standby), or it lost a write
    it had acknowledged (a failover to a standby that had not received it). Nothing was
    written. Fix: check that the server is up and the DSN's host and port (with a cluster,
    every host and ``target_session_attrs=read-write``); a retry with the same run id
    succeeds once it is reachable."""

    retryable = True


class DatabaseAccessError(ConfigurationError):
    """Postgres answered, and refused for a reason no retry changes: the DSN names a
    database that does not exist, the login failed (a wrong password, a role that does not
    exist or may not log in, no ``pg_hba.conf`` line for it), or the role lacks a privilege
    (``CONNECT`` on the database, DML on a table). Nothing was written. Fix: the message
    names the cause and the statement or DSN change that removes it."""


class SaverClosedError(DeterministicError, RuntimeError):
    """The saver was used after ``close()`` / ``aclose()`` or after leaving its ``with``.
    Fix: keep the saver open for as long as graphs use it (one per process, closed at
    shutdown)."""


class SchemaNotReadyError(DeterministicError):
    """The checkpoint tables are missing or older than this version of the package. Fix:
    run ``saver.setup()`` or ``langgraph-deterministic migrate`` as the tables' owner."""


class MigrationError(DeterministicError):
    """A migration step failed or was cancelled. The step was rolled back (or, for an
    index built CONCURRENTLY, is redone by the next run), the steps before it stay
    applied, and the advisory lock is released. Fix: run the migration again; it completes
    what is left."""

    retryable = True


class MigrationLockTimeoutError(MigrationError):
    """A migration step could not get its table lock within its short ``lock_timeout``
    after every retry: other sessions kept transactions open on the table. Workers were
    never stalled longer than one ``lock_timeout``. Fix: end those transactions (the
    message names the oldest), then run the migration again."""


class SerializationError(DeterministicError, TypeError):
    """A channel value or a pending write could not be serialised. Nothing was written.
    Fix: keep state to values LangGraph's serializer handles (JSON-like values, LangChain
    messages, dataclasses, Pydantic models), or give the saver a ``serde`` that handles
    yours."""


class UnsafeDataError(DeterministicError):
    """Stored data names a type that is not on the saver's allow-list (LangChain's
    messages and documents, LangGraph's own types, the standard library's value types and
    the types you registered), or is a pickle. Nothing it names was imported or called.
    Fix: if the type is yours, register it: ``DeterministicSaver(...,
    allowed_types=[YourType])``; if you never stored such a type, someone wrote the row
    by hand: see docs/explanation/security.md."""


class CorruptCheckpointError(DeterministicError):
    """A stored checkpoint or write cannot be read (its JSON is not an object, a blob is
    truncated or of an unknown kind). The message names the thread and checkpoint; other
    threads are not affected. Fix: ``langgraph-deterministic audit`` lists such threads;
    restore the rows from a backup or delete the thread (``saver.delete_thread``)."""


class IncompatibleLangGraphError(DeterministicError, ImportError):
    """The installed LangGraph lacks an extension point this package relies on. Fix:
    install a LangGraph version within this package's supported range (its
    ``pyproject.toml`` pins it; the message names the missing name)."""


class IncompatibleRestateError(DeterministicError, ImportError):
    """The installed restate-sdk lacks what RestateJournal relies on. Fix: install the
    ``restate`` extra's version range (``pip install 'langgraph-deterministic[restate]'``)."""


class MissingExtraError(DeterministicError, ImportError):
    """A feature needs an optional extra that is not installed. Fix: install the extra
    the message names, e.g. ``pip install 'langgraph-deterministic[agents]'``."""


class NondeterminismError(DeterministicError, RuntimeError):
    """User code asked for durable ops in a way that cannot be replayed from the journal:
    a replay took another path than the journal recorded, a durable op was started inside
    another, or the checkpoints a run replays from were pruned meanwhile. Fix: the message
    names the rule broken; node control flow must depend only on state and durable results,
    inner ops are called from the node beside the outer one, and threads with a run in
    flight are not pruned or deleted."""


class JournalClosedError(DeterministicError, RuntimeError):
    """A durable op was requested after its runner had finished. Fix: await every durable
    op inside the node that started it; do not keep tasks running past the node."""


class RunIdRequiredError(DeterministicError):
    """A graph run or checkpoint write carried no usable run id under
    run_id_policy="require": none at all, only the top-level ``config["run_id"]`` (LangChain's
    tracing id), a type other than str/UUID, or a config not built by ``run_config`` (so its
    input cannot be fingerprinted). Fix: ``run_config(thread_id, run_id)``."""


class RunInputMismatchError(DeterministicError):
    """A call reused a run_id with an input different from the one the run first had.
    Nothing was run or written. Fix: a new run_id for new work, the original input for a
    retry."""


class RunSupersededError(DeterministicError):
    """A retry arrived too late to be applied: a later run had moved the thread on before
    this run finished, or this run's Command(resume/update/goto) was already applied (a
    duplicate delivery). Nothing was run or written. Fix: none needed for a duplicate:
    stop retrying it; for new work, use a new run id."""


class ConcurrentRunError(DeterministicError):
    """Another attempt of the same run (a zombie, or a retry racing it), or another run,
    continued the thread's checkpoint first. This attempt's write was not stored; stop the
    attempt. Postgres decides, so this holds across processes and machines. Fix: let the
    orchestrator retry later with the same run id (the winner's work is kept)."""

    retryable = True

    def __init__(
        self, *args: object, lost_to_run: str | None = None, checkpoint_race: bool = False
    ) -> None:
        super().__init__(*args)
        #: The run id of the attempt that won the race, when the database named it (a
        #: checkpoint race, or a journaled op lost to another attempt). Equal to the
        #: refused call's own run id, the attempt lost to its own twin.
        self.lost_to_run = lost_to_run
        #: True when the winner's checkpoints are stored, so a retry of the same run
        #: resumes from them (a checkpoint race; a journaled op whose attempt lost the run).
        self.checkpoint_race = checkpoint_race


class ThreadBusyError(DeterministicError):
    """Another run holds the thread (a live lease) and this run's multitask_strategy is
    ``reject`` (or ``enqueue`` and its wait timed out). Nothing was run or written. Fix:
    retry later, or choose another strategy (``enqueue``, ``interrupt``, ``rollback``).

    ``lease_expires_at`` (aware UTC datetime, or None): when the holder's lease ends
    unless it is renewed, the earliest moment a retry can be admitted."""

    retryable = True
    holder_run_id: str | None = None
    lease_expires_at: Any = None


class RunUnfinishedError(DeterministicError):
    """The thread's previous run stopped unfinished (it crashed or raised and was never
    retried), so a new run would apply its input on top of a half-done step (an unanswered
    tool call, say). Nothing was run or written. Fix: retry the unfinished run with its run
    id (``invoke(None, run_config(thread_id, run_id))``, under the runner when it was
    journaled), or start the new run with ``multitask_strategy="rollback"``; for threads damaged
    before, ``langgraph-deterministic audit`` / ``repair``.

    ``unfinished_run_id`` names the unfinished run (None for a thread stuck before this
    saver), ``died`` is True when its worker died holding the thread (its lease expired)
    rather than the run raising, ``journaled`` when it ran under a ``DeterministicRunner``
    with a journal: what the integration modules read to finish it first."""

    thread_id: str | None = None
    unfinished_run_id: str | None = None
    died: bool = False
    journaled: bool = False


class RunSweptError(DeterministicError):
    """A retry of a run whose thread a retention sweep removed (``saver.sweep``,
    ``langgraph-deterministic prune``): the run's ledger row lives on as a tombstone, so
    the retry is refused instead of applying its input again to the emptied (or trimmed)
    thread. Nothing was run or written. Fix: stop retrying (the run had finished, or was
    abandoned, before its thread expired); new work takes a new run id. Tombstones are
    kept for the policy's ``tombstone_ttl``: keep it longer than any retry window."""

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "",
                 swept_at: object = None) -> None:  # fmt: skip
        super().__init__(message)
        self.thread_id = thread_id
        self.run_id = run_id
        self.swept_at = swept_at


class CheckpointPrunedError(ConfigurationError):
    """A graph run addressed a checkpoint (time travel) that a retention sweep removed.
    Nothing was run. Fix: address a checkpoint that exists (``graph.get_state_history``;
    after ``keep_latest`` the thread's latest one), or leave ``checkpoint_id`` out."""


class PruneRefusedError(DeterministicError, NotImplementedError):
    """``prune(strategy="keep_latest")`` would lose state that a DeltaChannel rebuilds from
    older checkpoints (a ``NotImplementedError``, as PostgresSaver raises). Nothing was
    pruned. Fix: ``strategy="delete"`` for those threads, or leave them out."""


class PruneArgumentError(ConfigurationError, TypeError):
    """``prune()`` got one thread id string instead of a sequence (a ``TypeError``, as
    PostgresSaver raises). Fix: ``prune([thread_id])``."""


class JournalLimitError(DeterministicError, ValueError):
    """A durable op's result is larger than the journal accepts (``max_result_bytes``).
    Nothing was stored; the op runs again on a retry. Fix: return a reference (an object
    key, a row id) instead of the payload, or raise the limit."""


class JournaledOpError(DeterministicError, RuntimeError):
    """A durable op's terminal failure, replayed from the journal, whose exception type
    could not be rebuilt (not importable, or its constructor needs other arguments). The
    message is the original one, prefixed with the original type. Fix: make the op's
    exception importable with a ``(message)`` constructor, or catch this class."""


def is_retryable(exc: BaseException) -> bool:
    """Whether retrying the call that raised ``exc`` (same run id, same input) can succeed.

    True for this package's transient errors (:class:`DatabaseUnavailableError`,
    :class:`ConcurrentRunError`, :class:`ThreadBusyError`, :class:`MigrationError`); False
    for its permanent ones (:class:`DatabaseAccessError`: no such database, a failed login,
    a missing privilege) and for any other exception, which is the graph's own business.
    The errors page (docs/reference/errors.md) tabulates both by class and by SQLSTATE.
    """
    return isinstance(exc, DeterministicError) and type(exc).retryable


__all__ = [
    "CheckpointPrunedError",
    "ConcurrentRunError",
    "ConfigurationError",
    "CorruptCheckpointError",
    "DatabaseAccessError",
    "DatabaseUnavailableError",
    "DeterministicError",
    "IncompatibleLangGraphError",
    "IncompatibleRestateError",
    "JournalClosedError",
    "JournalLimitError",
    "JournaledOpError",
    "MigrationError",
    "MigrationLockTimeoutError",
    "MissingExtraError",
    "NondeterminismError",
    "PruneArgumentError",
    "PruneRefusedError",
    "RunIdRequiredError",
    "RunInputMismatchError",
    "RunSupersededError",
    "RunSweptError",
    "RunUnfinishedError",
    "SaverClosedError",
    "SchemaNotReadyError",
    "SerializationError",
    "ThreadBusyError",
    "UnsafeDataError",
    "is_retryable",
]
