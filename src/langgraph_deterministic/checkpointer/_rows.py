"""Row mapping: checkpoint rows to LangGraph's tuples and back, and channel versions."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, PendingWrite, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg.types.json import Jsonb

try:  # a dependency of langsmith (so of every LangGraph install on CPython)
    import orjson
except ImportError:  # pragma: no cover - PyPy: the stdlib encoder only
    orjson = None  # type: ignore[assignment]

from langgraph_deterministic._serde import guarded_loads
from langgraph_deterministic.errors import (
    CorruptCheckpointError,
    DeterministicError,
    SerializationError,
    UnsafeDataError,
)


@dataclass(slots=True)
class Codec:
    """(De)serialisation of channel values and writes, with errors that name the culprit."""

    serde: SerializerProtocol

    def dumps(self, what: str, value: Any) -> tuple[str, bytes]:
        try:
            return self.serde.dumps_typed(value)
        except Exception as exc:  # the serde raises TypeError, msgpack errors, ...
            raise SerializationError(
                f"Cannot serialise {what} (a {type(value).__name__}): {exc}. Keep graph "
                "state to JSON-like data, dataclasses, pydantic models and LangChain "
                "messages, or pass a serde that handles this type (a msgpack-able "
                "type: register it with DeterministicSaver(..., allowed_types=[...]) so "
                "it is read back). Nothing was written."
            ) from exc

    def loads(self, type_: str, blob: bytes | None) -> Any:
        return guarded_loads(self.serde, type_, blob if blob is not None else b"")


# Types orjson would encode where json.dumps raises or encodes otherwise go to its
# ``default``, which there is none of: it raises, and json.dumps decides as before.
_ORJSON_AS_JSON = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    if orjson is not None
    else 0
)


def _orjson(value: Any) -> bytes | None:
    """orjson's encoding of ``value``, or None where it refuses the value."""
    if orjson is None:
        return None
    try:
        return orjson.dumps(value, option=_ORJSON_AS_JSON)
    except TypeError:  # orjson.JSONEncodeError
        return None


def _dumps_checkpoint(value: Any) -> bytes | str:
    """The checkpoint column's JSON: what ``json.dumps`` gives, as Postgres parses it, in a
    tenth of the time (~2 vs ~25 us for a graph run's ~2 KB checkpoint, 14 per run).

    orjson writes NaN and infinities as ``null`` where json.dumps writes tokens Postgres
    refuses. Every ``null`` in orjson's output is a None, a non-finite float or those
    letters inside a string; LangGraph's None channel values (its branch channels) are
    the only ones expected, so when there are more, json.dumps encodes the value instead.
    So does anything orjson refuses (a non-str key, an int over 64 bits, a passthrough
    type)."""
    data = _orjson(value)
    if data is not None:
        nulls = data.count(b"null")
        if not nulls:
            return data
        values = value.get("channel_values") if type(value) is dict else None
        if type(values) is dict and list(values.values()).count(None) == nulls:
            return data
    return json.dumps(value)


def _dumps_metadata(value: Any) -> bytes | str:
    """The metadata column's JSON, by orjson where its output means what json.dumps's
    does (~0.5 vs ~5 us, 14 per graph run): without a ``null``, which would be a None or
    a non-finite float (or those letters in a string); else, and for anything orjson
    refuses, json.dumps as before. (Like the checkpoint column's, it does not follow a
    process-wide ``psycopg.types.json.set_json_dumps``: the row holds JSON primitives
    and LangGraph's own keys only, which json.dumps encodes.)"""
    data = _orjson(value)
    if data is not None and b"null" not in data:
        return data
    return json.dumps(value)


def metadata_json(metadata: Mapping[str, Any]) -> Jsonb:
    """The ``metadata`` parameter of a checkpoint write."""
    return Jsonb(metadata, dumps=_dumps_metadata)


def checkpoint_json(checkpoint: Mapping[str, Any]) -> Jsonb:
    """The ``checkpoint`` parameter of a checkpoint write (LangGraph's own keys and
    primitives only: versions, ids, inline channel values)."""
    return Jsonb(checkpoint, dumps=_dumps_checkpoint)


def config_for(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def unreadable(thread_id: str, ns: str, checkpoint_id: str, exc: Exception) -> DeterministicError:
    """The error for a stored checkpoint (or write) that cannot be decoded."""
    where = f"Thread {thread_id!r} (checkpoint_ns {ns!r}) checkpoint {checkpoint_id!r}"
    if isinstance(exc, UnsafeDataError):
        return UnsafeDataError(f"{where}: {exc}")
    return CorruptCheckpointError(
        f"{where} cannot be read: {type(exc).__name__}: {exc}. Other threads are not "
        "affected. Fix: `langgraph-deterministic audit` lists the unreadable threads; "
        "restore their rows from a backup or delete the thread (saver.delete_thread)."
    )


def load_tuple(codec: Codec, row: Sequence[Any]) -> CheckpointTuple:
    """A ``select_checkpoint`` row to a CheckpointTuple (our error, naming the thread and
    checkpoint, when its JSON or a blob cannot be decoded)."""
    try:
        return _load_tuple(codec, row)
    except DeterministicError as exc:
        if isinstance(exc, UnsafeDataError | CorruptCheckpointError):
            raise unreadable(row[0], row[1], row[2], exc) from exc
        raise
    except Exception as exc:  # a non-object JSON, a truncated blob, an unknown kind
        raise unreadable(row[0], row[1], row[2], exc) from exc


def check_shape(row: Sequence[Any]) -> None:
    """Raise our error (naming the thread and checkpoint) when a ``select_checkpoint`` row's
    JSON is not what LangGraph writes: the code that reads it would fail anywhere."""
    checkpoint, metadata = row[4], row[5]
    problem = None
    for column, value in (("checkpoint", checkpoint), ("metadata", metadata)):
        if not isinstance(value, dict):
            problem = f"its {column} JSON is a {type(value).__name__}, not an object"
            break
    else:
        if not isinstance(checkpoint.get("channel_versions", {}), dict):
            problem = "its channel_versions are not an object"
    if problem is not None:
        raise unreadable(row[0], row[1], row[2], TypeError(problem))


def _load_tuple(codec: Codec, row: Sequence[Any]) -> CheckpointTuple:
    check_shape(row)
    (thread_id, ns, checkpoint_id, parent_id, checkpoint, metadata,
     b_channels, b_types, b_blobs,
     task_ids, w_channels, w_types, w_blobs, task_paths, idxs) = row  # fmt: skip
    values = dict(checkpoint.get("channel_values") or {})
    if b_channels:
        for channel, type_, blob in zip(b_channels, b_types, b_blobs, strict=True):
            if type_ != "empty":
                values[channel] = codec.loads(type_, blob)
    writes: list[PendingWrite] = []
    if task_ids:
        order = sorted(
            range(len(task_ids)),
            key=lambda i: writes_sort_key(task_paths[i], task_ids[i], idxs[i]),
        )
        writes = [(task_ids[i], w_channels[i], codec.loads(w_types[i], w_blobs[i])) for i in order]
    return CheckpointTuple(
        config=config_for(thread_id, ns, checkpoint_id),
        checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
        metadata=metadata,
        parent_config=config_for(thread_id, ns, parent_id) if parent_id else None,
        pending_writes=writes,
    )


def next_version(current: str | int | None) -> str:
    """Channel versions sort as strings: a zero-padded counter, then a random tiebreak.

    The format is langgraph-checkpoint-postgres's, so either saver can continue a thread
    the other wrote.
    """
    if current is None:
        counter = 0
    elif isinstance(current, int):
        counter = current
    else:
        counter = int(current.split(".", 1)[0])
    return f"{counter + 1:032}.{random.random():016}"
