"""Decoding stored data with an allow-list: a row never makes us import or call a name.

LangGraph's ``JsonPlusSerializer()`` rebuilds whatever class or function a msgpack
extension names (a warning only) unless ``LANGGRAPH_STRICT_MSGPACK=true``, so anyone who
can write the checkpoint tables runs code in every worker that reads them. The saver's
default serializer is that serializer in its strict mode: it builds only LangGraph's safe
types (LangChain's messages and documents, ``Send``, ``Command``, ``Interrupt``, the
standard library's value types) and the types the user registers, and it refuses pickles.

Where the strict serializer meets another name it returns the raw payload and emits a
``msgpack_blocked`` serde event (nothing imported, nothing called). :func:`guarded_loads`
turns that event into :class:`UnsafeDataError`, which names the type and how to allow it,
so a graph never continues on a half-decoded value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from langgraph.checkpoint.serde import _msgpack as _lg_msgpack
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_deterministic.errors import UnsafeDataError

#: A type the user allows: the class itself or its ``(module, qualified name)``.
AllowedType = type | tuple[str, str]

_REGISTER_HINT = (
    "If the type is yours, register it: DeterministicSaver(..., allowed_types=[{name}]) "
    "(or the tuple ({module!r}, {name!r})). If you never stored one, the row was written "
    "by someone else: see docs/explanation/security.md."
)


def type_key(allowed: AllowedType) -> tuple[str, str]:
    if isinstance(allowed, type):
        return (allowed.__module__, allowed.__name__)  # what the encoder writes
    module, name = allowed
    return (str(module), str(name))


def refusal(module: str, name: str, how: str = "") -> UnsafeDataError:
    return UnsafeDataError(
        f"Stored data names {module}.{name}{how}, which is not on the saver's allow-list; "
        "it was not imported or called. "
        + _REGISTER_HINT.format(module=module, name=name)
    )


class SafeSerializer(JsonPlusSerializer):
    """LangGraph's serializer with its strict allow-list, plus ``allowed_types``.

    Writing is LangGraph's (so either saver reads the rows); reading builds only the
    types on the list. A JSON blob's ``lc: 2`` constructor and a pickle are refused."""

    def __init__(self, allowed_types: Iterable[AllowedType] = ()) -> None:
        self.allowed_types: frozenset[tuple[str, str]] = frozenset(
            type_key(t) for t in allowed_types
        )
        super().__init__(
            pickle_fallback=False,
            # None is the strict built-in set only (LangGraph's SAFE_MSGPACK_TYPES).
            allowed_msgpack_modules=tuple(self.allowed_types) or None,
            allowed_json_modules=tuple(
                (*m.split("."), n) for m, n in self.allowed_types
            ) or None,
        )

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """LangGraph's decoding, with the allow-list: a pickle, or a JSON blob naming a
        constructor off the list, raises :class:`UnsafeDataError` before it is decoded."""
        type_, blob = data
        if type_ == "json":  # the pre-msgpack format: refuse what it names before decoding
            json.loads(blob, object_hook=self._check_json)
        elif type_ == "pickle":
            raise UnsafeDataError(
                "Stored data is a pickle, which can run any code when loaded; the saver "
                "does not load pickles. If you stored it yourself with "
                "JsonPlusSerializer(pickle_fallback=True), pass that serializer as "
                "DeterministicSaver(..., serde=...) and know that anyone who can write "
                "the checkpoint tables can then run code in your workers "
                "(docs/explanation/security.md)."
            )
        return super().loads_typed(data)

    def with_msgpack_allowlist(
        self, extra_allowlist: Iterable[tuple[str, ...] | type]
    ) -> JsonPlusSerializer:
        """LangGraph's clone with more types (its ``compile()`` calls it under
        ``LANGGRAPH_STRICT_MSGPACK=true`` with the state schema's types); the JSON check
        allows them too."""
        extra = tuple(extra_allowlist)
        clone = super().with_msgpack_allowlist(extra)
        if clone is not self and isinstance(clone, SafeSerializer):
            clone.allowed_types = self.allowed_types | {
                type_key(t) if isinstance(t, type) else (str(t[0]), str(t[1]))
                for t in extra
                if isinstance(t, type) or len(t) == 2
            }
        return clone

    def _check_json(self, value: dict[str, Any]) -> dict[str, Any]:
        ids = value.get("id")
        if value.get("lc") == 2 and value.get("type") == "constructor" and isinstance(ids, list):
            module, name = ".".join(map(str, ids[:-1])), (str(ids[-1]) if ids else "")
            key = (module, name)
            if key not in _lg_msgpack.SAFE_MSGPACK_TYPES and key not in self.allowed_types:
                raise refusal(module, name)
        return value


# The events of the decode running in this context (None: no decode of ours is running).
_blocked: ContextVar[list[SerdeEvent] | None] = ContextVar("lgd_serde_blocked", default=None)


def _on_event(event: SerdeEvent) -> None:
    if event.get("kind") in ("msgpack_blocked", "msgpack_method_blocked"):
        found = _blocked.get()
        if found is not None:
            found.append(event)


register_serde_event_listener(_on_event)


def guarded_loads(serde: SerializerProtocol, type_: str, blob: bytes) -> Any:
    """``serde.loads_typed`` that raises :class:`UnsafeDataError` where the serde refused
    a name (it returned the raw payload in its place)."""
    found: list[SerdeEvent] = []
    token = _blocked.set(found)
    try:
        value = serde.loads_typed((type_, blob))
    finally:
        _blocked.reset(token)
    if found:
        event = found[0]
        method = event.get("method")
        raise refusal(event["module"], event["name"], f".{method}()" if method else "")
    return value
