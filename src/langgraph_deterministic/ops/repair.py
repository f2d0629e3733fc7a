"""``langgraph-deterministic repair``: a fix per fault class that leaves the thread usable.

It repairs what :func:`~langgraph_deterministic.ops.audit.audit` reports as damage, one
thread per transaction. Without ``apply`` it only says what it would do. With it, for
each damaged thread, in one transaction:

1. lock the head checkpoint (``FOR UPDATE``) and refuse the thread if the head moved since
   the audit or a run may still be in progress on it (a step left and a write younger
   than ``idle``);
2. copy the whole thread to ``lgd-backup:<repair id>:<thread id>`` (``copy_thread``'s
   query): what the repair replaces can be restored or inspected;
3. apply the fixes below, then record them in ``lgd_repairs`` (migration 0017).

Fixes (docs/how-to/operations.md):

``forked_history``
    The checkpoints of the branch that is not the head's (descendants of the losing
    child of each fork point) are deleted from the thread; they stay in the backup.
``unfinished_step`` / ``unfinished_run``
    A new head checkpoint is written on top of the old one (``source: "update"``, like
    ``update_state``) in which no step is left: every ``branch:to:<node>`` trigger and
    pending Send is marked consumed. Ledger runs still ``running`` on the thread become
    ``superseded`` by the repair. (If the run can still be retried with its run id, that
    is the better fix: it finishes the work. Repair is for runs nobody will retry.)
``unanswered_tool_call``
    In the same new head, each tool call without a result gets a ToolMessage right after
    its AIMessage: ``status="error"``, content :data:`UNKNOWN_RESULT`, so the model knows
    the tool may or may not have run and can continue (or ask). Needs LangChain messages.
``reapplied_input``
    In the same new head, the copy of each message the retry applied a second time is
    removed: the occurrence after those the state held when the retry's input was applied
    (the last occurrence, where that state's blob is gone). The stored input is read as
    LangGraph reads it, in every input form (``_messages.py``). Needs LangChain
    messages; a thread whose input or messages ``add_messages`` cannot read is refused.
``no_run_id`` is a risk, not damage: nothing to repair.

The new head's run id is ``lgd-repair:<repair id>``; with our tables it takes the old
head's child slot in ``lgd_chain``, so a zombie attempt of ours can write nothing more.
The next input continues the thread as usual.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import psycopg
from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.checkpoint.base.id import uuid6
from psycopg.types.json import Jsonb

from langgraph_deterministic._compat.langgraph import START, TASKS, branch_to
from langgraph_deterministic._db.queries import queries as saver_queries
from langgraph_deterministic._db.translate import sentence
from langgraph_deterministic._dsn import chained, scrub
from langgraph_deterministic._messages import as_messages, input_readings, key, unanswered_calls
from langgraph_deterministic._serde import SafeSerializer, guarded_loads
from langgraph_deterministic.errors import (
    DatabaseUnavailableError,
    DeterministicError,
    SchemaNotReadyError,
)
from langgraph_deterministic.ops import DEFAULT_IDLE, queries
from langgraph_deterministic.ops.audit import (
    AuditReport,
    Finding,
    HeadState,
    audit,
    connect,
)

UNKNOWN_RESULT: Final = (
    "Tool result unknown: the worker running this tool call stopped before it returned, "
    "so the tool may or may not have run. Check before calling it again."
)
BACKUP_PREFIX: Final = "lgd-backup:"
_STATE_FAULTS: Final = {
    "unfinished_step", "unfinished_run", "unanswered_tool_call", "reapplied_input",
}  # fmt: skip


@dataclass(slots=True)
class ThreadRepair:
    thread_id: str
    faults: list[str]
    actions: list[str] = field(default_factory=list)
    refused: str | None = None
    applied: bool = False
    repair_id: str = ""
    backup_thread_id: str = ""
    new_head: str | None = None


@dataclass(slots=True)
class RepairReport:
    apply: bool
    threads: list[ThreadRepair] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.apply:
            return 1 if any(t.refused or not t.applied for t in self.threads) else 0
        return 1 if self.threads else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "apply": self.apply,
            "threads": [
                {
                    "thread_id": t.thread_id,
                    "faults": t.faults,
                    "actions": t.actions,
                    "refused": t.refused,
                    "applied": t.applied,
                    "repair_id": t.repair_id,
                    "backup_thread_id": t.backup_thread_id,
                    "new_head": t.new_head,
                }
                for t in self.threads
            ],
        }


class _Refused(DeterministicError):
    """A thread repair cannot safely do now; its transaction rolls back (never escapes
    ``repair``: it becomes the thread's ``refused`` reason)."""


def repair(
    dsn: str,
    *,
    apply: bool = False,
    thread_id: str | None = None,
    idle: timedelta = DEFAULT_IDLE,
    messages_channel: str = "messages",
    found: AuditReport | None = None,
) -> RepairReport:
    """Repair (``apply=True``) or plan the repair of every damaged thread at ``dsn``."""
    if found is None:
        found = audit(dsn, thread_id=thread_id, idle=idle, messages_channel=messages_channel)
    report = RepairReport(apply=apply)
    serde = SafeSerializer()  # builds no type a row names beyond the allow-list
    with connect(dsn) as conn:
        row = conn.execute(queries("repair")["has_tables"]).fetchone()
        assert row is not None
        has_log, has_chain, has_runs = (bool(x) for x in row)
        if apply and not has_log:
            raise SchemaNotReadyError(
                "repair --apply records what it does in lgd_repairs, which this database "
                "lacks. Fix: run `langgraph-deterministic migrate --phase pre` first. Besides "
                "adding our own lgd_* tables and functions, on PostgresSaver's tables it "
                f"{'; '.join(_pre_changes(conn))}. PostgresSaver keeps reading and writing "
                "them as before (`migrate --phase pre --dry-run` prints every statement; "
                "`langgraph-deterministic uninstall` takes it all back). Nothing was written."
            )
        for tid, findings in sorted(found.damaged.items()):
            head = found.heads[tid]
            plan = ThreadRepair(tid, sorted({f.fault for f in findings}))
            plan.repair_id = uuid.uuid4().hex[:16]
            plan.backup_thread_id = f"{BACKUP_PREFIX}{plan.repair_id}:{tid}"
            report.threads.append(plan)
            if "unreadable" in plan.faults:
                plan.refused = (
                    "its rows cannot be read ("
                    + "; ".join(f.detail for f in findings if f.fault == "unreadable")
                    + "): repair rewrites nothing it cannot read. Fix: restore the thread's "
                    "rows from a backup, or delete the thread (saver.delete_thread)"
                )
                continue
            if head.in_progress:
                plan.refused = (
                    f"a run may be in progress (a step is left and the last write is "
                    f"younger than {idle}). If its worker is alive, let the run finish (or "
                    "retry it with its run id); if the worker is dead (crashed, killed), "
                    "repair it now with `--idle 0` (or `--idle` below the last write's age)"
                )
                continue
            try:
                if apply:
                    with conn.transaction():
                        _repair_thread(
                            conn, serde, plan, findings, head, messages_channel,
                            write=True, has_chain=has_chain, has_runs=has_runs,
                        )  # fmt: skip
                    plan.applied = True
                else:
                    _repair_thread(
                        conn, serde, plan, findings, head, messages_channel,
                        write=False, has_chain=has_chain, has_runs=has_runs,
                    )  # fmt: skip
            except _Refused as exc:
                plan.refused = str(exc)
            except psycopg.errors.LockNotAvailable:
                plan.refused = "the head is locked by another session; retry later"
            except psycopg.OperationalError as exc:
                raise DatabaseUnavailableError(
                    f"repair lost its connection on thread {tid!r}: {sentence(scrub(str(exc), dsn))} "
                    "Its transaction rolled back; threads repaired before it stay repaired. "
                    "Fix: run repair again."
                ) from chained(exc, dsn)
    return report


def _pre_changes(conn: psycopg.Connection[Any]) -> list[str]:
    """What ``migrate --phase pre`` would change on the peer's tables of this database."""
    row = conn.execute(queries("repair")["pre_changes"]).fetchone()
    assert row is not None
    task_path, indexes, lz4, versions = row
    changes = []
    if not indexes:
        changes.append(
            "builds an index on checkpoints (metadata->>'run_id', CONCURRENTLY: writes go on)"
        )
    if lz4:
        changes.append(
            "sets lz4 compression on checkpoints.checkpoint, checkpoint_blobs.blob and "
            "checkpoint_writes.blob (a catalog change under a short lock: only values "
            "stored from then on are lz4, nothing is rewritten)"
        )
    if not task_path:
        changes.append("adds the column checkpoint_writes.task_path (PostgresSaver's v9)")
    if versions:
        changes.append(
            f"records PostgresSaver's schema versions {versions} in checkpoint_migrations"
        )
    return changes or ["changes nothing"]


def _repair_thread(
    conn: psycopg.Connection[Any],
    serde: SafeSerializer,
    plan: ThreadRepair,
    findings: list[Finding],
    head: HeadState,
    channel: str,
    *,
    write: bool,
    has_chain: bool,
    has_runs: bool,
) -> None:
    q = queries("repair")
    tid = plan.thread_id
    sql = q["lock_head"] if write else q["lock_head"].replace("FOR UPDATE", "")
    row = conn.execute(sql, {"thread_id": tid}).fetchone()
    if row is None or row[0] != head.head_id:
        raise _Refused("the thread moved on since the audit; run repair again")
    head_id, checkpoint, metadata = row
    faults = set(plan.faults)
    if write:
        conn.execute(
            saver_queries()["copy_thread"], {"source": tid, "target": plan.backup_thread_id}
        )
        plan.actions.append(f"copied the thread to {plan.backup_thread_id}")

    fork_parents = [f.checkpoint_id for f in findings if f.fault == "forked_history"]
    if fork_parents:
        (dead,) = conn.execute(
            q["dead_branches"], {"thread_id": tid, "head": head_id, "fork_parents": fork_parents}
        ).fetchone() or (None,)
        dead = list(dead or [])
        plan.actions.append(f"remove {len(dead)} checkpoint(s) of the losing branch of a fork")
        if write and dead:
            conn.execute(q["delete_checkpoints"], {"thread_id": tid, "ids": dead})
            if has_chain:
                conn.execute(q["delete_chain"], {"thread_id": tid, "ids": dead})

    if not faults & _STATE_FAULTS:
        _record(conn, plan, write, head_id)
        return

    cp: dict[str, Any] = copy.deepcopy(checkpoint)
    cv: dict[str, str] = cp.setdefault("channel_versions", {})
    vs: dict[str, dict[str, str]] = cp.setdefault("versions_seen", {})
    values: dict[str, Any] = cp.setdefault("channel_values", {})
    counter = max((int(str(v).split(".", 1)[0]) for v in cv.values()), default=0)
    version = f"{counter + 1:032}.{0.5:016}"
    new_blobs: list[dict[str, Any]] = []

    # no step left: every trigger consumed, as if the step had run
    closed = []
    for trigger in [k for k in values if k.startswith(branch_to())]:
        del values[trigger]
        node = trigger.removeprefix(branch_to())
        vs.setdefault(node, {})[trigger] = cv[trigger]
        closed.append(node)
    if START in cv:
        vs.setdefault(START, {})[START] = cv[START]
    if TASKS in cv:
        cv[TASKS] = version
        new_blobs.append({"channel": TASKS, "type": "empty", "blob": None})
    if closed or head.pending:
        plan.actions.append(
            "close the unfinished step" + (f" ({', '.join(sorted(closed))})" if closed else "")
        )

    messages = _messages(conn, serde, tid, cv, channel)
    needs = faults & {"reapplied_input", "unanswered_tool_call"}
    if messages is None and needs:
        raise _Refused(
            f"{', '.join(sorted(needs))} needs the head's {channel!r} channel as messages, and "
            "LangGraph's add_messages cannot read it as messages: the thread is left as it "
            "was (audit keeps reporting it). Fix: pass --messages-channel if the graph keeps "
            "its conversation under another key; else correct the thread with update_state"
        )
    if messages is not None:
        fixed = list(messages)
        for f in findings:
            if f.fault == "reapplied_input":
                fixed, note = _drop_duplicates(conn, serde, tid, f.checkpoint_id, fixed, channel)
                plan.actions.append(note)
        gaps = unanswered_calls(fixed)
        for index, call, _ in sorted(gaps, key=lambda g: g[0], reverse=True):
            at = index + 1
            while at < len(fixed) and isinstance(fixed[at], ToolMessage):
                at += 1
            fixed.insert(
                at,
                ToolMessage(
                    content=UNKNOWN_RESULT,
                    tool_call_id=str(call.get("id")),
                    name=call.get("name"),
                    status="error",
                    id=f"lgd-repair-{call.get('id')}",
                ),
            )
        if gaps:
            plan.actions.append(f"answer {len(gaps)} tool call(s) with 'tool result unknown'")
        if fixed != messages:
            cv[channel] = version
            t, b = serde.dumps_typed(fixed)
            new_blobs.append({"channel": channel, "type": t, "blob": b})

    run_id = f"lgd-repair:{plan.repair_id}"
    new_id = str(uuid6())
    if new_id <= head_id:
        raise _Refused(f"the head's id {head_id} sorts after a new id: the clock is behind")
    cp["id"] = new_id
    cp["ts"] = datetime.now(UTC).isoformat()
    cp["updated_channels"] = [b["channel"] for b in new_blobs]
    meta = {
        "source": "update", "step": int(metadata.get("step", -1)) + 1, "parents": {},
        "run_id": run_id, "lgd_repair": plan.repair_id,
    }  # fmt: skip
    plan.actions.append(f"write a new head checkpoint {new_id} (run id {run_id})")
    plan.new_head = new_id
    if write:
        for blob in new_blobs:
            conn.execute(q["insert_blob"], {"thread_id": tid, "version": version, **blob})
        conn.execute(
            q["insert_checkpoint"],
            {"thread_id": tid, "checkpoint_id": new_id, "parent": head_id,
             "checkpoint": Jsonb(cp), "metadata": Jsonb(meta)},
        )  # fmt: skip
        if has_chain:
            claimed = conn.execute(
                q["claim_slot"],
                {"thread_id": tid, "parent": head_id, "checkpoint_id": new_id, "run_id": run_id},
            ).fetchone()
            if claimed is None:
                raise _Refused("a worker of ours continued the head meanwhile; run repair again")
        if has_runs:
            conn.execute(q["close_runs"], {"thread_id": tid, "run_id": run_id})
    _record(conn, plan, write, head_id)


def _record(conn: psycopg.Connection[Any], plan: ThreadRepair, write: bool, head_id: str) -> None:
    if not write:
        return
    conn.execute(
        queries("repair")["record"],
        {"repair_id": plan.repair_id, "thread_id": plan.thread_id, "faults": plan.faults,
         "actions": Jsonb(plan.actions), "old_head": head_id, "new_head": plan.new_head,
         "backup": plan.backup_thread_id},
    )  # fmt: skip


def _messages(
    conn: psycopg.Connection[Any],
    serde: SafeSerializer,
    tid: str,
    cv: dict[str, str],
    channel: str,
) -> list[BaseMessage] | None:
    if channel not in cv:
        return None
    row = conn.execute(
        queries("repair")["head_blob"],
        {"thread_id": tid, "channel": channel, "version": cv[channel]},
    ).fetchone()
    if row is None or row[0] == "empty":
        return None
    return as_messages(_decode(serde, row[0], row[1]))


def _decode(serde: SafeSerializer, type_: str, blob: bytes) -> Any:
    try:
        return guarded_loads(serde, type_, blob)
    except Exception as exc:  # refused by the allow-list, truncated, unknown kind
        raise _Refused(
            f"a blob of the thread cannot be read ({type(exc).__name__}: {exc}); repair "
            "rewrites nothing it cannot read"
        ) from exc


def _messages_at(
    conn: psycopg.Connection[Any],
    serde: SafeSerializer,
    tid: str,
    checkpoint_id: str,
    channel: str,
) -> list[BaseMessage] | None:
    """The messages channel at one checkpoint of the thread (None when its blob is gone)."""
    row = conn.execute(
        queries("repair")["checkpoint_versions"], {"thread_id": tid, "checkpoint_id": checkpoint_id}
    ).fetchone()
    if row is None or not row[0] or channel not in row[0]:
        return None
    return _messages(conn, serde, tid, row[0], channel)


def _drop_duplicates(
    conn: psycopg.Connection[Any],
    serde: SafeSerializer,
    tid: str,
    input_checkpoint: str,
    messages: list[BaseMessage],
    channel: str,
) -> tuple[list[BaseMessage], str]:
    """Remove the later copy of each message the re-applied input added; returns the
    messages and what was done. Raises :class:`_Refused` when the input cannot be read
    as messages (then the thread stays as it is, and the audit keeps reporting it)."""
    values = [
        _decode(serde, t, b)
        for ch, t, b in conn.execute(
            queries("repair")["input_writes"],
            {"thread_id": tid, "checkpoint_id": input_checkpoint},
        )
        if ch == channel
    ]
    if not values:
        return messages, "the re-applied input wrote no messages: nothing to remove"
    readings = [input_readings(v) for v in values]
    if not all(readings):
        raise _Refused(
            f"the input applied at checkpoint {input_checkpoint} cannot be read as messages "
            "(LangGraph's add_messages refuses it too); remove its copy by hand with "
            "update_state, then run repair again"
        )
    counts = Counter(key(m) for m in messages)
    wanted: list[BaseMessage] = []
    for options in readings:
        # the reading whose messages the state holds twice (a tuple stored as a list has
        # two): that is the one add_messages applied
        twice = [r for r in options if r and all(counts[key(m)] >= 2 for m in r)]
        wanted.extend((twice or options)[0])
    # The input checkpoint holds the state the input was applied to: a message that was
    # there n times, the retry's copy is its (n+1)th occurrence now (a later, identical
    # message the user sent stays). Without that state (a blob pruned), the last one.
    before = _messages_at(conn, serde, tid, input_checkpoint, channel)
    drop: set[int] = set()
    removed = kept = 0
    for k, copies in Counter(key(m) for m in wanted).items():
        hits = [i for i, m in enumerate(messages) if key(m) == k]
        if before is not None:
            start = sum(key(m) == k for m in before)
            chosen = hits[start : start + copies] if start else []
        else:
            chosen = hits[1:][-copies:]
        drop.update(chosen)
        removed += len(chosen)
        kept += copies - len(chosen)
    out = [m for i, m in enumerate(messages) if i not in drop]
    note = f"remove {removed} re-applied input message(s)"
    if kept:
        note += (
            f"; {kept} input message(s) are in the state once already (same message id,"
            " or removed since): nothing to remove"
        )
    return out, note


def dump(report: RepairReport) -> str:
    return json.dumps(report.to_json(), indent=2)
