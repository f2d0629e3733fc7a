"""Input fingerprints: equal for equal graph inputs, whatever dict order, object identity
or the message ids LangGraph assigns in place."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import hashlib
import json
import uuid
from collections.abc import Mapping
from functools import cache
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from langgraph_deterministic.checkpointer._keys import InputKind

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage
    from langgraph.types import Command, Send

# Fingerprints are stored and compared across versions (a retry may land on a newer
# worker): every fast path below gives exactly what the general one does. A str key's
# json.dumps is encode_basestring_ascii's (json.dumps would build an encoder per key:
# ~3 of a graph input's ~34 us each); dicts and lists are told by their exact type first.


def _key(key: Any, d: int) -> str:
    if type(key) is str:
        return encode_basestring_ascii(key)
    return json.dumps(_canonical(key, d), sort_keys=True)


def _mapping(value: Mapping[Any, Any], d: int) -> dict[str, Any]:
    items = sorted(((_key(k, d), _canonical(v, d)) for k, v in value.items()), key=_first)
    return {"m": items}


def _first(item: tuple[str, Any]) -> str:
    return item[0]


@cache
def _lazy_types() -> tuple[type[BaseMessage], type[Command[Any]], type[Send]]:
    from langchain_core.messages import BaseMessage
    from langgraph.types import Command, Send

    return BaseMessage, Command, Send


def _canonical(value: Any, depth: int = 0) -> Any:
    """A JSON-able form of ``value`` that is equal for equal inputs, whatever dict order,
    object identity or message ids LangGraph assigned in place."""
    if depth > 64:
        raise ValueError("input nested deeper than 64 levels")
    d = depth + 1
    if value is None or isinstance(value, bool | int | str):
        return value
    kind = type(value)
    if kind is dict:
        return _mapping(value, d)
    if kind is list:
        return [_canonical(v, d) for v in value]
    if isinstance(value, float):
        return {"f": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b": bytes(value).hex()}
    if isinstance(value, uuid.UUID):
        return {"u": str(value)}
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return {"t": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"d": str(value)}
    if isinstance(value, enum.Enum):
        return {"e": type(value).__qualname__, "v": _canonical(value.value, d)}
    if isinstance(value, Mapping):
        return _mapping(value, d)
    if isinstance(value, list | tuple):
        return [_canonical(v, d) for v in value]
    if isinstance(value, set | frozenset):
        return {"s": sorted(json.dumps(_canonical(v, d), sort_keys=True) for v in value)}
    # LangGraph objects and LangChain messages.
    base_message, command, send = _lazy_types()
    if isinstance(value, base_message):
        # The id is left out: LangGraph gives input messages ids in place, so the same
        # message object passed again on a retry in one process would otherwise differ.
        dumped = value.model_dump()
        dumped.pop("id", None)
        return {"msg": type(value).__name__, "v": _canonical(dumped, d)}
    if isinstance(value, command):
        return {
            "cmd": _canonical(
                {
                    "graph": value.graph,
                    "update": value.update,
                    "resume": value.resume,
                    "goto": value.goto,
                },
                d,
            )
        }
    if isinstance(value, send):
        return {"send": value.node, "arg": _canonical(value.arg, d)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic v2
        return {"model": type(value).__qualname__, "v": _canonical(model_dump(), d)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dc": type(value).__qualname__, "v": _canonical(fields, d)}
    raise TypeError(f"cannot fingerprint a {type(value).__qualname__}")


def input_kind(value: Any) -> InputKind:
    from langgraph.types import Command

    if value is None:
        return "none"
    return "command" if isinstance(value, Command) else "input"


def input_fingerprint(value: Any) -> str:
    """``"<kind>:<sha256 prefix>"`` of a graph input; equal for equal inputs.

    ``kind`` is ``input``, ``command`` (a ``Command``: resume, update, goto) or ``none``.
    Raises ``TypeError`` for a value it cannot fingerprint (an arbitrary object).
    """
    canon = json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canon.encode("utf-8")).hexdigest()[:32]
    return f"{input_kind(value)}:{digest}"


def fingerprint_kind(fingerprint: str | None) -> InputKind | None:
    if not fingerprint:
        return None
    kind = fingerprint.split(":", 1)[0]
    return kind if kind in ("input", "command", "none") else None  # type: ignore[return-value]
