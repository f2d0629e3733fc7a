"""What a load hands LangGraph, shared by the plain reads (``_reads``) and a graph run's
admission (``_admission``): pending Sends of old checkpoints folded in, the tuple a graph
run gets (its attempt token, branch point and head mark), and the refusal of an
addressed checkpoint that does not exist."""

from __future__ import annotations

import secrets
from typing import Any, cast

from langgraph.checkpoint.base import CheckpointMetadata, CheckpointTuple

from langgraph_deterministic._compat.langgraph import TASKS
from langgraph_deterministic._db.batch import Batch, Operation
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer._row_types import CheckpointRow
from langgraph_deterministic.checkpointer._rows import Codec, next_version
from langgraph_deterministic.checkpointer.contract import (
    ATTEMPT_KEY,
    BRANCH_KEY,
    HEAD_KEY,
    RUN_ID_KEY,
    CallInfo,
)
from langgraph_deterministic.errors import ConfigurationError

_CHECKPOINT = CheckpointRow._fields.index("checkpoint")
_PARENT = CheckpointRow._fields.index("parent_checkpoint_id")


def _with_pending_sends(codec: Codec, rows: list[tuple[Any, ...]]) -> Operation[None]:
    """Checkpoints of format v < 4 keep pending Sends as writes of their parent: fold them
    into the TASKS channel the way current LangGraph expects to find them."""
    old = [
        (i, CheckpointRow._make(r))
        for i, r in enumerate(rows)
        if isinstance(r[_CHECKPOINT], dict) and r[_CHECKPOINT].get("v", 4) < 4 and r[_PARENT]
    ]
    if not old:
        return
    (sends,) = yield Batch.read(
        queries()["pending_sends"],
        {
            "thread_ids": [r.thread_id for _, r in old],
            "checkpoint_ns": [r.checkpoint_ns for _, r in old],
            "checkpoint_ids": [r.parent_checkpoint_id for _, r in old],
        },
    )
    by_parent = {(s[0], s[1], s[2]): s for s in sends or ()}
    for i, row in old:
        found = by_parent.get((row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id))
        if found is None:
            continue
        packets = [codec.loads(t, b) for t, b in zip(found[3], found[4], strict=True)]
        type_, blob = codec.dumps("pending sends", packets)
        versions = row.checkpoint.setdefault("channel_versions", {})
        versions[TASKS] = max(versions.values()) if versions else next_version(None)
        # Append to the row's blob arrays (they may be NULL when it had no blobs).
        rows[i] = row._replace(
            channels=[*(row.channels or []), TASKS],
            types=[*(row.types or []), type_],
            blobs=[*(row.blobs or []), blob],
        )


def _for_graph_run(
    found: CheckpointTuple,
    info: CallInfo,
    attempt: str | None = None,
    branch_from: str | None = None,
    head: str | None = None,
) -> CheckpointTuple:
    """The tuple a graph run loads: with an attempt token in its config (LangGraph copies
    it into every write of this run attempt, which is how the fencing tells attempts
    apart), the checkpoint it branches from when it addressed a past one on purpose, what
    it loaded (``head``: see HEAD_KEY), and the run id in the form the caller used, so
    LangGraph's own ``metadata.run_id`` comparison holds for a ``uuid.UUID`` too."""
    # Drawn from the OS, not uuid.uuid4(): tests (LangGraph's among them) patch uuid4 to
    # make ids deterministic, and a draw of ours would shift every id after it.
    configurable = {
        **found.config["configurable"],
        ATTEMPT_KEY: attempt or secrets.token_hex(16),
    }
    if branch_from is not None:
        configurable[BRANCH_KEY] = branch_from
    if head is not None:
        configurable[HEAD_KEY] = head
    metadata = found.metadata
    if (
        info.raw_run_id is not None
        and not isinstance(info.raw_run_id, str)
        and metadata.get(RUN_ID_KEY) == info.run_id
    ):
        metadata = cast(CheckpointMetadata, {**metadata, RUN_ID_KEY: info.raw_run_id})
    return found._replace(config={**found.config, "configurable": configurable}, metadata=metadata)


def _refuse_missing_checkpoint(thread_id: str, checkpoint_id: str) -> None:
    raise ConfigurationError(
        f"Checkpoint {checkpoint_id} does not exist on thread {thread_id!r} (it was never "
        "written, or it was pruned or deleted). Running from it would start an empty "
        "conversation that names the missing checkpoint as its parent, and the thread's "
        "history would fall off the chain. Nothing was run. Address a checkpoint that exists "
        "(see graph.get_state_history), or leave checkpoint_id out to continue from the "
        "thread's latest checkpoint."
    )
