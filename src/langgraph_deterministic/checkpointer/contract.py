"""The retry contract, as pure decisions: no I/O here.

The saver core (``_core``) asks this module three kinds of question and turns the
answers into SQL; the sync and async APIs share every answer.

* **What call is this?** :meth:`RunContract.call_info` reads a config: thread, namespace,
  the run id (``metadata.run_id`` / ``configurable.run_id``, a ``uuid.UUID`` normalised to
  its string form; the top-level ``config["run_id"]`` alone is refused, LangGraph never
  stores it), whether the call comes from a running graph, and the input fingerprint
  that :func:`~langgraph_deterministic.config.run_config` recorded.
* **May this graph run start?** :meth:`RunContract.decide_start` compares the call with
  the thread's head checkpoint and the run ledger, *before* LangGraph runs anything:
  proceed, hand back a finished run's final checkpoint, or raise
  ``RunIdRequiredError`` / ``RunInputMismatchError`` / ``RunSupersededError``.
* **Who may run on this thread now?** :class:`Admission` reads the verdict of
  ``lgd_admit_v3`` (the thread's lease, taken in the same round trip as the head read)
  and raises ``ThreadBusyError`` / ``RunUnfinishedError`` per the run's
  ``multitask_strategy``; :func:`unanswered_tool_calls` spots a thread stuck on a tool
  call that no lease or ledger row explains (a thread adopted from PostgresSaver).
* **What goes into a write?** :meth:`RunContract.stored_metadata` (no secrets by
  default) and :meth:`RunContract.guard_put` / :meth:`RunContract.guard_writes` (the
  parameters of the fencing statements that run in the write's own transaction).

Fencing itself needs the database's view of the thread at commit time, so the final
word belongs to Postgres, in the functions of migration 0016 (``migrations/
0016_pre_arbitration_v6.sql``): ``lgd_put_checkpoint_v6`` claims the one child slot of the
parent checkpoint (a unique key), so two attempts can never both extend the same
checkpoint, checks the thread's lease and moves the ledger; the fence of pending writes
refuses writes to a checkpoint another attempt has already moved past. What needs
LangGraph's checkpoint format (whether a new run found the previous one finished:
:meth:`RunContract.guard_put`) is decided here and passed as a plain parameter.
:func:`~._sqlstate.translate_guard_error` maps their SQLSTATEs to our errors.

This module holds the decisions (:class:`RunContract`); its parts live beside it: what
one call is (``_call``: :class:`CallInfo`), the config keys (``_keys``), run-id parsing
(``_run_ids``), input fingerprints (``_fingerprint``), the input recorder callback
(``_recorder``), the secrets filter (``_secrets``), the ledger rows (``_ledger``) and the
SQLSTATEs (``_sqlstate``). The
names below are re-exported here, the module's public path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    EXCLUDED_METADATA_KEYS,
    CheckpointMetadata,
    CheckpointTuple,
)

from langgraph_deterministic._compat.langgraph import INTERRUPT, NULL_TASK_ID, TASKS
from langgraph_deterministic.checkpointer._call import CallInfo
from langgraph_deterministic.checkpointer._fingerprint import (
    fingerprint_kind,
    input_fingerprint,
    input_kind,
)
from langgraph_deterministic.checkpointer._keys import (
    ATTEMPT_KEY,
    BRANCH_KEY,
    BRANCHING,
    CARRIED,
    FINGERPRINT_KEY,
    GRAPH_RUN_MARKER,
    HEAD_KEY,
    MULTITASK_KEY,
    ON_FINISHED_KEY,
    RUN_ID_KEY,
    STRATEGIES,
    InputKind,
    MultitaskStrategy,
    Policy,
    check_strategy,
)
from langgraph_deterministic.checkpointer._ledger import (
    RUN_STATUSES,
    Admission,
    Closing,
    HeldLease,
    Lease,
    LedgerRow,
    RunRecord,
    RunStatus,
)
from langgraph_deterministic.checkpointer._recorder import RunInputRecorder, find_recorder
from langgraph_deterministic.checkpointer._run_ids import run_id_of
from langgraph_deterministic.checkpointer._secrets import DEFAULT_METADATA_KEYS, looks_secret
from langgraph_deterministic.checkpointer._sqlstate import (
    SQLSTATE_CHILD_TAKEN,
    SQLSTATE_CLOCK_BEHIND,
    SQLSTATE_COMMAND_REPLAY,
    SQLSTATE_LEASED,
    SQLSTATE_PARENT_LOST,
    SQLSTATE_STALE_WRITE,
    SQLSTATES,
    lost_admission_error,
    translate_guard_error,
)
from langgraph_deterministic.errors import (
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
    ThreadBusyError,
)

logger = logging.getLogger("langgraph_deterministic")


# --- what call is this? -------------------------------------------------------------


class RunContract:
    """The run-id policy and metadata allow-list of one saver, and its decisions."""

    def __init__(
        self,
        policy: Policy = "require",
        metadata_keys: Iterable[str] | None = None,
        *,
        multitask_strategy: MultitaskStrategy = "reject",
        lease_ttl: float = 30.0,
        enqueue_timeout: float = 300.0,
    ) -> None:
        self.policy: Policy = policy
        self.multitask_strategy: MultitaskStrategy = check_strategy(multitask_strategy)
        self.lease_ttl = float(lease_ttl)
        self.enqueue_timeout = float(enqueue_timeout)
        self.metadata_keys: frozenset[str] = (
            DEFAULT_METADATA_KEYS if metadata_keys is None else frozenset(metadata_keys)
        )
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()

    @property
    def enforced(self) -> bool:
        return self.policy != "off"

    def call_info(self, config: RunnableConfig, thread_id: str, checkpoint_ns: str) -> CallInfo:
        configurable = config.get("configurable") or {}
        in_graph_run = GRAPH_RUN_MARKER in configurable
        if self.policy == "off":  # not self.enforced
            run_id, raw = None, None
            with contextlib.suppress(RunIdRequiredError):
                run_id, raw = run_id_of(config)
            return CallInfo(thread_id, checkpoint_ns, run_id, raw, in_graph_run, None, None,
                            bool(configurable.get("checkpoint_id")))  # fmt: skip
        run_id, raw = run_id_of(config)
        if run_id is None and not in_graph_run:
            carried = CARRIED.get()
            if carried is not None and carried[0] == thread_id:
                if str(configurable.get("checkpoint_id") or "") in carried[2]:
                    run_id = raw = carried[1]
                else:  # another operation on the thread (e.g. an unaddressed update_state)
                    CARRIED.set(None)
        recorder = find_recorder(config)
        attempt = configurable.get(ATTEMPT_KEY)
        strategy = configurable.get(MULTITASK_KEY)
        branching = BRANCHING.get() if checkpoint_ns != "" and in_graph_run else None
        inherited = (
            branching is not None and branching[0] == thread_id and branching[1] == run_id
        )
        if inherited and attempt is None and branching is not None:
            # Without it, a branch's and the first run's first checkpoints of a namespace
            # (both loaded nothing) could not be told apart without run ids.
            attempt = branching[2]
        return CallInfo(
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            run_id=run_id,
            raw_run_id=raw,
            in_graph_run=in_graph_run,
            fingerprint=recorder.fingerprint if recorder is not None else None,
            attempt=str(attempt) if attempt is not None else None,
            addressed=bool(configurable.get("checkpoint_id")),
            recorded=recorder is not None,
            # The callbacks' run id: LangGraph neither compares nor stores it, so a retry
            # carrying only this id would re-apply its input (see require_run_id).
            tracing_id=config.get("run_id") if run_id is None else None,
            strategy=check_strategy(strategy) if strategy is not None else None,
            branch_from=configurable.get(BRANCH_KEY),
            inherited_branch=inherited,
            recorder=recorder,
            head=configurable.get(HEAD_KEY) if checkpoint_ns == "" else None,
            on_finished=str(configurable.get(ON_FINISHED_KEY) or "return"),
        )

    # -- policy --------------------------------------------------------------------

    def require_run_id(self, info: CallInfo, what: str) -> None:
        """Raise or warn, per policy, when a write (or a graph run) has no run id."""
        if info.run_id is not None or not self.enforced:
            return
        if info.tracing_id is not None:
            message = (
                f'{what} on thread {info.thread_id!r} has only a top-level config["run_id"] '
                f"({info.tracing_id}), which is LangChain's tracing id: LangGraph never "
                "compares or stores it, so a retry would re-apply its input. Pass the run "
                "id as metadata.run_id: run_config(thread_id, run_id) does it (keep "
                "config['run_id'] for tracing if you like)."
            )
            self._refuse_or_warn(info, message)
            return
        if self.policy == "require":
            raise RunIdRequiredError(
                f"{what} on thread {info.thread_id!r} carries no run id (metadata.run_id), "
                'and this saver has run_id_policy="require". Without one a retried call '
                "re-applies its input. Build the config with "
                "langgraph_deterministic.run_config(thread_id, run_id), using an id that "
                "stays the same across retries of one call (a workflow id, a task id, a "
                'business key). To adopt gradually, use run_id_policy="warn". Nothing was '
                "written."
            )
        with self._warned_lock:
            if info.thread_id in self._warned:
                return
            if len(self._warned) > 100_000:
                self._warned.clear()
            self._warned.add(info.thread_id)
        logger.warning(
            "langgraph-deterministic: %s on thread %r carries no run id; a retry of this "
            "call would re-apply its input. Use run_config(thread_id, run_id). (Logged "
            "once per thread; run_id_policy='warn'.)",
            what,
            info.thread_id,
        )

    # -- may this graph run start? ---------------------------------------------------

    def checks_start(self, info: CallInfo) -> bool:
        """Whether ``get_tuple`` for this call runs the start checks: the outer graph of a
        running graph loading its thread (its latest checkpoint, or one it addresses:
        time travel), not get_state."""
        return self.enforced and info.in_graph_run and info.root

    def strategy_of(self, info: CallInfo) -> MultitaskStrategy:
        return info.strategy or self.multitask_strategy

    def admission(self, info: CallInfo, attempt: str, ticket: int | None) -> dict[str, Any] | None:
        """Parameters of ``lgd_admit_v3`` for a graph run, or None when it takes no lease:
        without a run id the run cannot be told apart from another, and without
        run_config's recorder the saver would never hear that it returned."""
        if info.run_id is None or info.recorder is None:
            return None
        if info.recorder.bound:
            # Its call holds a lease already: a graph called inside a node of that run
            # with a config of its own but no run_config (it has only the outer call's
            # recorder), or LangGraph's second load of the same call (its superseded
            # probe after an addressed load).
            return None
        return {
            "thread_id": info.thread_id,
            "run_id": info.run_id,
            "attempt": attempt,
            "strategy": self.strategy_of(info),
            "ttl": self.lease_ttl,
            "ticket": ticket,
        }

    def refuse_busy(self, info: CallInfo, admission: Admission, waited: float | None) -> None:
        strategy = self.strategy_of(info)
        lease = admission.holder
        held = f"run {lease.run_id!r}" if lease else "another run"
        until = f" (lease until {lease.expires_at:%H:%M:%S} UTC)" if lease else ""
        if waited is not None:
            why = (
                f"Run {info.run_id!r} waited {waited:.1f} s in the queue of thread "
                f"{info.thread_id!r} (multitask_strategy='enqueue'), the saver's "
                f"enqueue_timeout, and {held} still holds the thread{until}."
            )
        else:
            why = (
                f"Thread {info.thread_id!r} is busy: {held} is running on it{until}, and run "
                f"{info.run_id!r} has multitask_strategy={strategy!r}."
            )
        exc = ThreadBusyError(
            f"{why} Nothing was run or written. Retry later, or start the run with "
            "run_config(thread_id, run_id, multitask_strategy=...): 'enqueue' waits its "
            "turn, 'interrupt' stops the running run at its next write and continues from "
            "its latest checkpoint, 'rollback' stops it and removes what it wrote."
        )
        if lease is not None:
            exc.holder_run_id, exc.lease_expires_at = lease.run_id, lease.expires_at
        raise exc

    def refuse_unfinished(
        self, info: CallInfo, admission: Admission, journaled: bool = False
    ) -> None:
        """Refuse a new run on a thread whose previous run is unfinished, naming the fix
        for the way that run was started: ``journaled`` (its attempts are in the journal:
        a DeterministicRunner ran it, and its durable ops need one to continue)."""
        lease = admission.holder
        prev = lease.run_id if lease else "?"
        died = not (lease and lease.ended == "error")
        how = (
            "stopped without returning (its worker died; its lease expired)"
            if died
            else "raised an exception"
        )
        cont = f"None, run_config({info.thread_id!r}, {prev!r})"
        if journaled:
            retry = (
                "DeterministicRunner(journal=PostgresJournal(saver)).invoke(graph, "
                f"{cont}) (it ran under a DeterministicRunner: graph.invoke cannot run its "
                "durable ops)"
            )
        else:
            retry = f"graph.invoke({cont})"
        exc = RunUnfinishedError(
            f"The previous run on thread {info.thread_id!r}, {prev!r}, {how} and was never "
            f"retried: the thread holds its half-done step (for an agent, possibly a tool call "
            f"without a result, which model providers reject). Run {info.run_id!r} would "
            "apply its input on top of it, so nothing was run or written. Either finish the "
            f"unfinished run first: {retry} continues it where it stopped (its original "
            "input instead of None does the same), then run this one; or start this run "
            "with run_config(..., multitask_strategy='rollback') to remove what the "
            "unfinished run wrote and continue from the checkpoint before it ('interrupt' "
            "continues on top of it instead). run_graph_task (Celery), temporal.run_graph "
            "and retry.invoke_with_retries finish a run whose worker died themselves. To "
            "find and fix threads damaged before: `langgraph-deterministic audit` / "
            "`langgraph-deterministic repair`."
        )
        exc.thread_id, exc.unfinished_run_id = info.thread_id, lease.run_id if lease else None
        exc.died, exc.journaled = died, journaled
        raise exc

    def check_stuck_head(
        self, info: CallInfo, head: CheckpointTuple, kind: InputKind | None
    ) -> None:
        """A new input on a thread whose head is stuck on a tool call that nothing explains
        (no lease, no ledger row: a thread written before this saver, or by the peer):
        refused under "require", warned about under "warn"."""
        if kind != "input" or any(w[1] == INTERRUPT for w in head.pending_writes or ()):
            return
        calls = unanswered_tool_calls(head.checkpoint.get("channel_values") or {})
        if not calls:
            return
        message = (
            f"Thread {info.thread_id!r} is stuck on an unfinished step: its latest checkpoint "
            f"{head.config['configurable']['checkpoint_id']} has tool calls without a result "
            f"({', '.join(calls[:3])}), left by a run that never finished. Applying run "
            f"{info.run_id!r}'s input on top would make every later model call fail (providers "
            "reject unanswered tool calls). Run `langgraph-deterministic audit --thread "
            f"{info.thread_id}` to see the damage and `langgraph-deterministic repair` to fix "
            "it, or retry the unfinished run with its run id."
        )
        if self.policy == "require":
            raise RunUnfinishedError(message + " Nothing was run or written.")
        self._warn_once(info.thread_id, message)

    def decide_start(
        self,
        info: CallInfo,
        head_metadata: Mapping[str, Any] | None,
        ledger: LedgerRow | None,
    ) -> StartDecision:
        """Decide, before LangGraph applies any input or runs any node, what a graph run
        may do on this thread. Raises the contract's errors; writes nothing."""
        self.require_run_id(info, "A graph run")
        run_id = info.run_id
        if run_id is None:
            return StartDecision("proceed")
        if not info.recorded:
            self._require_recorder(info)
        if head_metadata is None:
            return StartDecision("proceed")
        head_run = head_metadata.get(RUN_ID_KEY)
        kind = fingerprint_kind(info.fingerprint)
        if head_run == run_id:
            stored = head_metadata.get(FINGERPRINT_KEY)
            self._check_same_input(info, stored if isinstance(stored, str) else None, kind)
            if kind == "command":
                raise RunSupersededError(
                    f"Run {run_id!r} on thread {info.thread_id!r} was started by a Command "
                    "(resume/update/goto) that has already been applied: the thread's "
                    "latest checkpoint was written by this run after it. Delivering the "
                    "same Command again would answer a later interrupt or apply the update "
                    "twice, so nothing was run or written. If this is a redelivery, the "
                    "first delivery succeeded: read its result with graph.get_state(...) "
                    "or saver.get_run(thread_id, run_id). To answer a new interrupt, send a "
                    "new Command under a new run_id (or resume by interrupt id: "
                    "Command(resume={interrupt.id: value}))."
                )
            return StartDecision("proceed")
        if ledger is None:
            return StartDecision("proceed")
        # A run this thread has seen before, but the head is another run's: a late retry.
        self._check_same_input(info, ledger.input_fingerprint, kind)
        if ledger.status == "done" and kind != "command" and ledger.last_checkpoint_id:
            return StartDecision("final", ledger.last_checkpoint_id)
        if ledger.status == "rolled_back":
            raise RunSupersededError(
                f"Run {run_id!r} on thread {info.thread_id!r} was rolled back by a later run "
                "(multitask_strategy='rollback'): its checkpoints were removed. Retrying it "
                "now would apply its input on top of the later run, so nothing was run or "
                "written. Start a new run (a new run_id) if its input still matters."
            )
        raise RunSupersededError(
            f"Run {run_id!r} was retried on thread {info.thread_id!r} after a later run "
            f"({head_run!r}) moved the thread on; run {run_id!r} had not finished "
            f"(status {ledger.status!r}). Re-running it now would apply its input on top of "
            "the later run's state, so nothing was run or written. Treat the run as "
            "abandoned, or start a new run (a new run_id) with the input it should apply "
            "now; saver.get_run(thread_id, run_id) shows what it had done."
        )

    def finished_again(self, info: CallInfo, finished_ts: str | None) -> None:
        """A graph call of a run whose call had returned: a retry (the final state is
        returned, nothing runs), or new work under a reused run id (a turn dropped). Said
        in the log, or refused with ``run_config(..., on_finished="raise")``."""
        when = "at an unknown time"
        if finished_ts:
            with contextlib.suppress(ValueError):
                at = _dt.datetime.fromisoformat(finished_ts)
                age = (_dt.datetime.now(_dt.UTC) - at).total_seconds()
                when = f"at {at.isoformat(timespec='seconds')}, {age:.0f} s ago"
        what = (
            f"Run {info.run_id!r} on thread {info.thread_id!r} had returned ({when}): this "
            "call names the same run id with the same input"
        )
        if info.on_finished == "raise":
            raise RunSupersededError(
                f"{what}, and run_config(..., on_finished='raise') refuses a finished run's "
                "retry. Nothing was run or written. If this is new work (a user sending the "
                "same text again, an activity or task name reused), give it a new run id; "
                "if it is a late duplicate, stop retrying it and read the run's result "
                "with saver.get_run(thread_id, run_id)."
            )
        logger.warning(
            "langgraph-deterministic: %s, so it is taken as a retry: it returns the run's "
            "final state and runs nothing. If it is new work (a user sending the same text "
            "again, an activity or task name reused), it was dropped: give each new call a "
            "new run id (run_config(..., on_finished='raise') refuses such a call instead).",
            what,
        )

    def _warn_once(self, thread_id: str, message: str) -> None:
        with self._warned_lock:
            key = f"{thread_id}\x00{message[:40]}"
            if key in self._warned:
                return
            if len(self._warned) > 100_000:
                self._warned.clear()
            self._warned.add(key)
        logger.warning("langgraph-deterministic: %s (Logged once per thread.)", message)

    def _require_recorder(self, info: CallInfo) -> None:
        message = (
            f"The graph run {info.run_id!r} on thread {info.thread_id!r} has a run id but its "
            "config was not made by run_config(), so the saver cannot see its input: a "
            "retry with a different input, or a second delivery of the same Command(resume="
            "...), could not be refused before nodes run. Build the config with "
            "langgraph_deterministic.run_config(thread_id, run_id, **configurable) (to add "
            "callbacks, append to its 'callbacks' list instead of replacing it)."
        )
        self._refuse_or_warn(info, message)

    def _refuse_or_warn(self, info: CallInfo, message: str) -> None:
        """Policy "require" refuses before anything runs; "warn" logs once per thread."""
        if self.policy == "require":
            raise RunIdRequiredError(message + " Nothing was run or written.")
        self._warn_once(info.thread_id, message)

    def _check_same_input(
        self, info: CallInfo, stored: str | None, kind: InputKind | None = None
    ) -> None:
        if kind == "none" and stored and info.recorder is not None:
            # ``invoke(None, run_config(thread, run_id))`` of a run the thread has seen:
            # LangGraph continues from the latest checkpoint, applying no input, so
            # nothing can be dropped. The call adopts the run's fingerprint (its writes
            # carry it, and a later retry with the original input still matches).
            info.recorder.fingerprint = stored
            return
        if info.fingerprint and stored and info.fingerprint != stored:
            raise RunInputMismatchError(
                f"Run {info.run_id!r} on thread {info.thread_id!r} was first called with a "
                f"different input ({stored}) than this call ({info.fingerprint}). A run id "
                "names one call with one input; reusing it for another input would silently "
                "drop the new input. Nothing was run or written. If this is new work, give it "
                "a new run_id; if it is a retry, pass exactly the original input."
            )

    # -- what goes into a write? -----------------------------------------------------

    def stored_metadata(
        self, config: RunnableConfig, metadata: CheckpointMetadata, info: CallInfo
    ) -> dict[str, Any]:
        """The metadata row of a checkpoint: LangGraph's own keys, the config's
        ``metadata`` (minus secret-looking names), allow-listed configurable keys, and the
        normalised run id and input fingerprint."""
        stored: dict[str, Any] = {
            k: v.replace("\u0000", "") if isinstance(v, str) else v
            for k, v in metadata.items()
            if k != "writes"
        }

        _copy_metadata(stored, (config.get("metadata") or {}).items(), self.metadata_keys)
        # Only allow-listed configurable keys: look those up (a graph run's configurable
        # holds a score of LangGraph's own keys, none of them copied).
        configurable = config.get("configurable") or {}
        _copy_metadata(
            stored,
            [(k, configurable[k]) for k in self.metadata_keys if k in configurable],
            self.metadata_keys,
        )
        if info.run_id is not None:
            stored[RUN_ID_KEY] = info.run_id
        if info.fingerprint is not None and info.root:
            stored.setdefault(FINGERPRINT_KEY, info.fingerprint)
        return stored

    def guard_put(
        self,
        info: CallInfo,
        parent_id: str | None,
        checkpoint: Mapping[str, Any],
        source: Any,
        parent: ParentRow | None = None,
    ) -> dict[str, Any] | None:
        """Parameters of ``lgd_put_checkpoint_v6`` beyond the checkpoint row, or None
        (policy off). ``parent``: the parent's run id and checkpoint, which the core reads
        first only when :meth:`needs_parent` says so."""
        if not self.enforced:
            return None
        ledger = info.root and info.run_id is not None
        branch = self.deliberate(info, parent_id)
        closes: Closing | None = None
        closes_run: str | None = None
        if ledger and parent_id and not branch:
            closes, closes_run = self._closing(info, parent_id, checkpoint, source, parent)
        return {
            "run_id": info.run_id,
            "attempt": info.attempt,
            "fingerprint": info.fingerprint,
            "ledger": ledger,
            "branch": branch,
            "closes": closes,
            "closes_run": closes_run,
        }

    def needs_parent(self, info: CallInfo, parent_id: str | None, source: Any) -> bool:
        """Whether this write must read its parent before :meth:`guard_put` can decide what
        it makes of the parent's run: an input written outside a graph run (a graph run
        knows the checkpoint it loaded: HEAD_KEY), a rare direct use of the API."""
        return (
            self.enforced
            and info.root
            and info.run_id is not None
            and parent_id is not None
            and not info.in_graph_run
            and source == "input"
            and not self.deliberate(info, parent_id)
        )

    def _closing(
        self,
        info: CallInfo,
        parent_id: str,
        checkpoint: Mapping[str, Any],
        source: Any,
        parent: ParentRow | None,
    ) -> tuple[Closing | None, str | None]:
        """What a root write of ``info.run_id`` continuing ``parent_id`` makes of the run
        that wrote the parent, and that run (None: the SQL reads the parent's run id).

        A new input on a finished run's last checkpoint leaves LangGraph nothing to
        discard: versions_seen (interrupts aside) and the pending Sends' version stay as
        they were, so the previous run is ``done``; anything else moved the thread on
        before it finished: ``superseded``. The ledger row changes only if that run is
        still running or interrupted (decided in the same transaction, by the SQL)."""
        head = _parse_head(info.head)
        if head is not None and head[0] == parent_id:
            _, head_run, seen = head  # the checkpoint this graph run loaded
            if head_run is None or head_run == info.run_id:
                return None, None
            done = source == "input" and progress_digest(checkpoint) == seen
            return ("done" if done else "superseded"), head_run
        if head is not None and info.in_graph_run:
            return None, None  # after its first write, a run continues its own checkpoints
        # Unknown parent (a write outside a graph run, or a graph run on an empty thread):
        # the SQL reads the parent's run id and closes it only if it is another run's.
        if parent is not None:
            parent_run, parent_checkpoint = parent
            if parent_run is None or parent_run == info.run_id:
                return None, None
            done = source == "input" and progress_digest(checkpoint) == progress_digest(
                parent_checkpoint
            )
            return ("done" if done else "superseded"), parent_run
        return "superseded", None

    def deliberate(self, info: CallInfo, parent_id: str | None) -> bool:
        """Whether a write continues ``parent_id`` on purpose, as a branch of its own when
        the parent was continued already: a graph run addressed at that past checkpoint,
        or a write outside any graph run that no attempt handed out (update_state at a past
        checkpoint, or ``as_node="__copy__"`` of a thread's first checkpoint: a second root,
        ``parent_id`` None). Writes of graph runs (zombies, race losers) stay fenced. A
        subgraph of a time-travelling run is a branch in its namespace: lgd_put_checkpoint_v6
        lets it take its lineage slot where another run holds the parent's, never where its
        own run does."""
        if info.inherited_branch:
            return True
        if not info.in_graph_run and info.attempt is None:
            return True
        return parent_id is not None and info.branch_from == parent_id

    def chain_slot(self, info: CallInfo, checkpoint_id: str) -> str:
        """The child slot of ``checkpoint_id`` whose holder fences this writer's pending
        writes: a deliberate branch's own lineage slot at its branch point."""
        if info.branch_from == checkpoint_id:
            return f"{checkpoint_id}~{info.run_id or info.attempt}"
        return checkpoint_id

    def guard_writes(
        self, info: CallInfo, checkpoint_id: str, task_id: str, channels: Iterable[str]
    ) -> dict[str, Any] | None:
        """Parameters of ``lgd_guard_writes_v6`` and of the fence of pending writes, or
        None (policy off)."""
        if not self.enforced:
            return None
        channels = list(channels)
        return {
            "thread_id": info.thread_id,
            "checkpoint_ns": info.checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "slot": self.chain_slot(info, checkpoint_id),
            "attempt": info.attempt,
            "run_id": info.run_id,
            "command": info.root and task_id == NULL_TASK_ID and info.run_id is not None,
            "interrupted": info.root and info.run_id is not None and INTERRUPT in channels,
        }


def _copy_metadata(
    stored: dict[str, Any], items: Iterable[tuple[str, Any]], metadata_keys: frozenset[str]
) -> None:
    """Copy ``items`` into a metadata row: new keys only, no LangGraph-internal ones, no
    secret-looking ones unless allow-listed, str/bool/int/float values only."""
    for key, value in items:
        if key in stored or key in EXCLUDED_METADATA_KEYS or key.startswith("__"):
            continue
        if key not in metadata_keys and looks_secret(key, value):
            continue
        if isinstance(value, str):
            stored[key] = value.replace("\u0000", "")
        elif isinstance(value, bool | int | float):
            stored[key] = value


#: A parent checkpoint as ``guard_put`` reads it: its run id and its checkpoint JSON.
ParentRow = tuple[str | None, Mapping[str, Any]]


def progress_digest(checkpoint: Mapping[str, Any]) -> str:
    """What LangGraph changes in a checkpoint when a new input discards unfinished work
    of the previous run: ``versions_seen`` (without the interrupt bookkeeping) and the
    version of the pending-Sends channel. Equal digests of a run's last checkpoint and
    of the next run's input checkpoint: nothing was discarded, the run had finished."""
    seen = {
        task: {str(ch): str(v) for ch, v in (chans or {}).items()}
        for task, chans in (checkpoint.get("versions_seen") or {}).items()
        if task != INTERRUPT
    }
    tasks = (checkpoint.get("channel_versions") or {}).get(TASKS)
    text = json.dumps([seen, None if tasks is None else str(tasks)], sort_keys=True)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def head_mark(
    checkpoint_id: str, metadata: Mapping[str, Any] | None, checkpoint: Mapping[str, Any]
) -> str:
    """The HEAD_KEY value for a root graph run that loaded this checkpoint."""
    run = (metadata or {}).get(RUN_ID_KEY)
    return json.dumps(
        [checkpoint_id, None if run is None else str(run), progress_digest(checkpoint)]
    )


def _parse_head(value: Any) -> tuple[str, str | None, str] | None:
    if not isinstance(value, str):
        return None
    return _parse_head_text(value)


@functools.lru_cache(maxsize=256)
def _parse_head_text(value: str) -> tuple[str, str | None, str] | None:
    """Parsed once per graph run: every root write of the run carries the same HEAD_KEY."""
    try:
        checkpoint_id, run, digest = json.loads(value)
    except ValueError:
        return None
    return str(checkpoint_id), run, str(digest)


def unanswered_tool_calls(values: Mapping[str, Any]) -> list[str]:
    """Ids of the unanswered tool calls of the last AI message (``_messages.unanswered_calls``,
    the rule audit and repair use) in any channel holding a message list, in any of the
    forms LangGraph accepts."""
    from langgraph_deterministic._messages import unanswered_calls

    found: list[str] = []
    for value in values.values():
        if isinstance(value, list) and value:
            found += [str(call.get("id")) for _, call, _ in unanswered_calls(value, last_only=True)]
    return found


def carry_run_id(info: CallInfo, *configs: RunnableConfig | None) -> None:
    """Remember the checkpoints a call outside a graph run with a run id handed out or
    stored (see CARRIED); a call of another run or thread starts afresh."""
    if info.in_graph_run or info.run_id is None:
        return
    ids = {str((c or {}).get("configurable", {}).get("checkpoint_id") or "") for c in configs}
    if None in configs:
        ids.add("")  # no parent: a copy of this first checkpoint has none either
    carried = CARRIED.get()
    if carried is not None and carried[:2] == (info.thread_id, info.run_id):
        ids |= carried[2]
    CARRIED.set((info.thread_id, info.run_id, frozenset(ids)))


@dataclass(frozen=True, slots=True)
class StartDecision:
    """``proceed``: load the head as usual. ``final``: the run finished earlier and a
    later run has moved the thread on; load its final checkpoint instead, so LangGraph
    resumes a finished run (runs nothing, writes nothing) and returns its final state."""

    action: Literal["proceed", "final"]
    checkpoint_id: str | None = None


__all__ = [
    "ATTEMPT_KEY",
    "BRANCHING",
    "BRANCH_KEY",
    "CARRIED",
    "DEFAULT_METADATA_KEYS",
    "FINGERPRINT_KEY",
    "GRAPH_RUN_MARKER",
    "HEAD_KEY",
    "MULTITASK_KEY",
    "ON_FINISHED_KEY",
    "RUN_ID_KEY",
    "RUN_STATUSES",
    "SQLSTATES",
    "SQLSTATE_CHILD_TAKEN",
    "SQLSTATE_CLOCK_BEHIND",
    "SQLSTATE_COMMAND_REPLAY",
    "SQLSTATE_LEASED",
    "SQLSTATE_PARENT_LOST",
    "SQLSTATE_STALE_WRITE",
    "STRATEGIES",
    "Admission",
    "CallInfo",
    "Closing",
    "HeldLease",
    "InputKind",
    "Lease",
    "LedgerRow",
    "MultitaskStrategy",
    "ParentRow",
    "Policy",
    "RunContract",
    "RunInputRecorder",
    "RunRecord",
    "RunStatus",
    "StartDecision",
    "carry_run_id",
    "check_strategy",
    "find_recorder",
    "fingerprint_kind",
    "head_mark",
    "input_fingerprint",
    "input_kind",
    "lost_admission_error",
    "progress_digest",
    "run_id_of",
    "translate_guard_error",
    "unanswered_tool_calls",
]
