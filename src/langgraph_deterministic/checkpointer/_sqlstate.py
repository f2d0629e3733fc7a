"""The errors the SQLSTATEs our SQL raises become (the codes: ``_db.sqlstate``, re-exported
here for the checkpointer's modules); see docs/explanation/architecture.md."""

from __future__ import annotations

from langgraph_deterministic._db.sqlstate import (
    SQLSTATE_CHILD_TAKEN,
    SQLSTATE_CLOCK_BEHIND,
    SQLSTATE_COMMAND_REPLAY,
    SQLSTATE_LEASED,
    SQLSTATE_PARENT_LOST,
    SQLSTATE_STALE_WRITE,
    SQLSTATES,
)
from langgraph_deterministic.checkpointer._call import CallInfo
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    RunSupersededError,
)

__all__ = [
    "SQLSTATES",
    "SQLSTATE_CHILD_TAKEN",
    "SQLSTATE_CLOCK_BEHIND",
    "SQLSTATE_COMMAND_REPLAY",
    "SQLSTATE_LEASED",
    "SQLSTATE_PARENT_LOST",
    "SQLSTATE_STALE_WRITE",
    "lost_admission_error",
    "translate_guard_error",
]

# A lost race's detail ends with the winner: "... of run <run>".
_OF_RUN = " of run "


def _winner(detail: str) -> str | None:
    at = detail.rfind(_OF_RUN)
    return detail[at + len(_OF_RUN) :] if at >= 0 else None


def translate_guard_error(exc: BaseException, info: CallInfo) -> DeterministicError | None:
    """Our error for a failure of the guard statements, or None if it is something else."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_detail", None) or ""
    run = f"run {info.run_id!r}" if info.run_id else "a call without run id"
    Run = run[0].upper() + run[1:]
    if sqlstate in (SQLSTATE_CHILD_TAKEN, SQLSTATE_STALE_WRITE):
        return _lost_race(sqlstate, info, detail, run)
    return _other_guard_error(sqlstate, info, detail, run, Run)


def _lost_race(sqlstate: str, info: CallInfo, detail: str, run: str) -> ConcurrentRunError:
    winner = _winner(detail)
    if sqlstate == SQLSTATE_CHILD_TAKEN:
        return ConcurrentRunError(
            f"Another attempt got to thread {info.thread_id!r} first ({detail}): the "
            f"checkpoint this attempt of {run} continues from has already been continued. "
            "This attempt is a zombie or lost a race with a retry or with another run; its "
            "checkpoint was not stored, so the thread's history stays linear and the other "
            "writer's state is kept. Stop this attempt: do not retry it blindly -- a retry "
            "with the same run_id resumes from what the winner stored. Make sure one call is "
            "executed by one worker at a time (a lease, Temporal's activity heartbeat).",
            lost_to_run=winner,
            checkpoint_race=True,
        )
    return ConcurrentRunError(
        f"Another attempt has moved thread {info.thread_id!r} past the checkpoint these "
        f"pending writes of {run} belong to ({detail}). They were not stored: this "
        "attempt is a zombie or lost a race. Stop it; a retry with the same run_id "
        "resumes from what the winner stored.",
        lost_to_run=winner,
        checkpoint_race=True,
    )


def _other_guard_error(
    sqlstate: str | None, info: CallInfo, detail: str, run: str, Run: str
) -> DeterministicError | None:
    if sqlstate == SQLSTATE_LEASED:
        return ConcurrentRunError(
            f"{Run} was stopped on thread {info.thread_id!r}: another run took the thread over "
            f"({detail}) -- multitask_strategy 'interrupt' or 'rollback', or a run admitted "
            "after this attempt's lease expired. This write was not stored. Stop this "
            "attempt; the thread continues with the other run."
        )
    if sqlstate == SQLSTATE_PARENT_LOST:
        return DatabaseUnavailableError(
            f"{Run} on thread {info.thread_id!r} continued a checkpoint the database does "
            f"not hold ({detail}): it was written and acknowledged, then lost - a failover "
            "to a standby that had not received it (asynchronous replication), or a restore. "
            "This write was not stored. Retry the call with the same run_id: the retry "
            "loads the thread's surviving head and continues from there (work done after "
            "that head runs again)."
        )
    if sqlstate == SQLSTATE_CLOCK_BEHIND:
        return ConfigurationError(
            f"{Run} on thread {info.thread_id!r} wrote a checkpoint whose id sorts before "
            f"its parent's ({detail}). LangGraph loads a thread's greatest checkpoint id, so "
            "it would never be read again. Checkpoint ids carry the writer's clock: this "
            "machine's clock is behind the one that wrote the parent. Sync the clocks (NTP) "
            "and retry. Nothing was written."
        )
    if sqlstate == SQLSTATE_COMMAND_REPLAY:
        return RunSupersededError(
            f"{Run} on thread {info.thread_id!r} tried to apply a Command to a "
            "checkpoint the same run wrote after applying it once: a duplicate delivery of "
            "the same Command(resume/update/goto). It was refused so it cannot answer a "
            "later interrupt. Build configs with run_config(...) so duplicates are refused "
            "before anything runs; send a new answer under a new run_id."
        )
    return None


def lost_admission_error(info: CallInfo) -> DatabaseUnavailableError:
    """An LG413 that names the very lease this attempt's admission replaced: the database
    lost the admission (see _core._lost_admission), no other run took the thread."""
    return DatabaseUnavailableError(
        f"The write of run {info.run_id!r} on thread {info.thread_id!r} was not stored: "
        "the database no longer holds this attempt's admission (its lease of the thread), "
        "which it had acknowledged - the lease is back with the run that held it before, "
        "as after a failover to a standby that had not received the admission, or a "
        "restore. No other run took the thread over. Retry the call with the same run_id."
    )
