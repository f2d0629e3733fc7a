"""The reads of DeterministicSaver: a thread's checkpoint (``get_tuple``; a graph run's
load goes on to its admission, ``_admission``), the list of checkpoints, a run's ledger
row with its last checkpoint, and a DeltaChannel's history along the parent chain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    writes_sort_key,
)
from psycopg.types.json import Jsonb

from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer._admission import _start_graph_run
from langgraph_deterministic.checkpointer._ids import _thread_ns, check_key_sizes, storable
from langgraph_deterministic.checkpointer._loading import (
    _for_graph_run,
    _refuse_missing_checkpoint,
    _with_pending_sends,
)
from langgraph_deterministic.checkpointer._rows import Codec, load_tuple
from langgraph_deterministic.checkpointer._statements import _AT_CHECKPOINT, _LATEST, _list_sql
from langgraph_deterministic.checkpointer.contract import (
    Lease,
    RunContract,
    RunRecord,
    carry_run_id,
)


def get_tuple(
    codec: Codec,
    config: RunnableConfig,
    contract: RunContract | None = None,
    journal_attempt: str | None = None,
) -> Operation[CheckpointTuple | None]:
    """``journal_attempt``: the attempt a PostgresJournal session runs; a graph run of that
    attempt registers it in the journal at its admission (see _start_graph_run)."""
    thread_id, ns = _thread_ns(config)
    select = queries()["select_checkpoint"]
    info = contract.call_info(config, thread_id, ns) if contract is not None else None
    if info is not None and info.in_graph_run:
        check_key_sizes(thread_id, ns, info.run_id, get_checkpoint_id(config))
    if info is not None and contract is not None and contract.checks_start(info):
        return (yield from _start_graph_run(codec, config, contract, info, journal_attempt))
    params = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id := get_checkpoint_id(config):
        storable("checkpoint_id", checkpoint_id)
        sql = select + _AT_CHECKPOINT
        params["checkpoint_id"] = checkpoint_id
    else:
        sql = select + _LATEST
    (rows,) = yield Batch.read(sql, params)
    if not rows:
        if checkpoint_id and info is not None and info.in_graph_run and info.root:
            _refuse_missing_checkpoint(thread_id, checkpoint_id)
        return None
    yield from _with_pending_sends(codec, rows)
    found_tuple = load_tuple(codec, rows[0])
    if info is not None and contract is not None and contract.enforced:
        if info.in_graph_run:
            return _for_graph_run(found_tuple, info)
        carry_run_id(info, found_tuple.config, found_tuple.parent_config)
    return found_tuple


def list_checkpoints(
    codec: Codec,
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Operation[list[CheckpointTuple]]:
    params: dict[str, Any] = dict.fromkeys(
        ("thread_id", "checkpoint_ns", "checkpoint_id", "run_id", "filter", "before", "limit")
    )
    if config:
        params["thread_id"], _ = _thread_ns(config)
        params["checkpoint_ns"] = config["configurable"].get("checkpoint_ns")
        params["checkpoint_id"] = get_checkpoint_id(config) or None
    for key in ("checkpoint_ns", "checkpoint_id"):
        if isinstance(params[key], str):
            storable(key, params[key])
    if filter:
        run_id = filter.get("run_id")
        if isinstance(run_id, str):
            params["run_id"] = run_id
        params["filter"] = Jsonb(dict(filter))
    if before is not None:
        params["before"] = get_checkpoint_id(before) or None
        if params["before"] is not None:
            storable("checkpoint_id", str(params["before"]))
    if limit is not None:
        params["limit"] = int(limit)
    # Unprepared: planned with the parameters' values, so only the conditions given stay.
    (rows,) = yield Batch((Statement(_list_sql(), params, fetch=True, prepare=False),))
    if not rows:
        return []
    yield from _with_pending_sends(codec, rows)
    return [load_tuple(codec, r) for r in rows]


def get_run(codec: Codec, thread_id: str, run_id: str) -> Operation[RunRecord | None]:
    """The ledger row of one run and the checkpoint it last wrote (its final state once it
    has finished), in one round trip."""
    storable("thread_id", thread_id)
    storable("run_id", run_id)
    (rows,) = yield Batch.read(
        queries()["select_run"].replace("{select_checkpoint}", queries()["select_checkpoint"]),
        {"thread_id": str(thread_id), "run_id": str(run_id)},
    )
    if not rows:
        return None
    row = rows[0]
    (thread, run, status, attempts, first_id, last_id, fingerprint, superseded_by,
     created_at, updated_at, strategy, outcome,
     l_run, l_attempt, l_strategy, l_outcome, l_acquired, l_expires, l_ended) = row[:19]  # fmt: skip
    checkpoint_row = row[19:]
    state = None
    if checkpoint_row[0] is not None:
        found = [tuple(checkpoint_row)]
        yield from _with_pending_sends(codec, found)
        state = load_tuple(codec, found[0])
    lease = (
        Lease(l_run, l_attempt, l_strategy, l_outcome, l_acquired, l_expires, l_ended)
        if l_run is not None
        else None
    )
    if status == "running" and lease is not None and lease.run_id == run and lease.ended == "ok":
        # Its graph call returned (not at an interrupt: that reads "interrupted"). The
        # ledger row says so only once the next run starts; the lease knows already.
        status = "done"
    return RunRecord(
        thread_id=thread,
        run_id=run,
        status=status,
        attempts=attempts,
        first_checkpoint_id=first_id,
        last_checkpoint_id=last_id,
        input_fingerprint=fingerprint,
        superseded_by=superseded_by,
        created_at=created_at,
        updated_at=updated_at,
        last_checkpoint=state,
        multitask_strategy=strategy,
        multitask_outcome=outcome,
        lease=lease,
    )


def delta_history(
    codec: Codec, config: RunnableConfig, channels: Sequence[str]
) -> Operation[dict[str, DeltaChannelHistory]]:
    """Writes and seed per channel along the parent chain, in one round trip."""
    channels = list(channels)
    if not channels:
        return {}
    thread_id, ns = _thread_ns(config)
    checkpoint_id = get_checkpoint_id(config)
    if not checkpoint_id:
        head = yield from get_tuple(codec, config)
        if head is None:
            return {ch: {"writes": []} for ch in channels}
        checkpoint_id = head.config["configurable"]["checkpoint_id"]
    (rows,) = yield Batch.read(
        queries()["delta_history"],
        {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
            "channels": channels,
        },
    )
    writes: dict[str, list[tuple[int, tuple[str, str, int], PendingWrite]]] = {
        ch: [] for ch in channels
    }
    result: dict[str, DeltaChannelHistory] = {}
    seeds: dict[str, Any] = {}
    for kind, _cid, depth, channel, type_, blob, task_id, task_path, idx, inline in rows or ():
        if kind == "w":
            value = codec.loads(type_, blob)
            key = writes_sort_key(task_path, task_id, idx)
            writes[channel].append((depth, key, (task_id, channel, value)))
        else:
            seeds[channel] = codec.loads(type_, blob) if type_ is not None else inline
    for ch in channels:
        # Oldest checkpoint first (deepest), and within one the order live execution used.
        ordered = sorted(writes[ch], key=lambda w: (-w[0], w[1]))
        entry: DeltaChannelHistory = {"writes": [w[2] for w in ordered]}
        if ch in seeds:
            entry["seed"] = seeds[ch]
        result[ch] = entry
    return result
