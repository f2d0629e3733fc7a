"""Messages as LangGraph reads them: the one place audit and repair coerce a stored value.

A ``messages`` channel (or an input written to it) holds whatever the caller passed and the
serde kept: message objects, ``("user", text)`` tuples (msgpack stores them as lists, so
they read back as ``["user", text]``), ``{"role": ..., "content": ...}`` dicts, plain
strings, content blocks, a single one of these or a list of them. LangGraph's
``add_messages`` turns every one of them into messages before it merges; :func:`as_messages`
runs the same coercion (langchain-core's ``convert_to_messages``), so what audit and repair
compare is what the graph's state holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    convert_to_messages,
    message_chunk_to_message,
)

MessageKey = tuple[str, str]


def as_messages(value: Any) -> list[BaseMessage] | None:
    """``value`` coerced as ``add_messages`` coerces an update before it merges (a single
    item becomes a list; each item goes through langchain-core's ``convert_to_messages``
    and chunks become messages), or None when LangGraph would not read it as messages
    either. Nothing is merged or given an id: the result has one message per item."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    try:
        return [message_chunk_to_message(m) for m in convert_to_messages(items)]
    except (NotImplementedError, ValueError, TypeError, KeyError):
        return None


def input_readings(value: Any) -> list[list[BaseMessage]]:
    """Every way the graph may have read a stored input: as it reads back, and, for a
    two-item list whose first item is a role (a ``(role, content)`` tuple the serde stored
    as a list), as that tuple. The caller picks the one the state shows."""
    readings = []
    first = as_messages(value)
    if first is not None:
        readings.append(first)
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        as_tuple = as_messages(tuple(value))
        if as_tuple is not None and [key(m) for m in as_tuple] != [key(m) for m in first or []]:
            readings.append(as_tuple)
    return readings


def key(message: BaseMessage) -> MessageKey:
    """What makes two messages the same input: type and content (ids differ between
    attempts: ``add_messages`` assigns them when the input is applied)."""
    return message.type, json.dumps(message.content, sort_keys=True, default=str)


def as_message(item: Any) -> BaseMessage | None:
    """One item of a message list as :func:`as_messages` reads it (a message passes as
    it is: chunks are subclasses of their message), or None if it is not a message."""
    if isinstance(item, BaseMessage):
        return item
    if not isinstance(item, (Sequence, dict)):  # what convert_to_messages refuses, cheaply
        return None
    read = as_messages([item])
    return read[0] if read else None


def unanswered_calls(
    messages: Sequence[Any], *, last_only: bool = False
) -> list[tuple[int, dict[str, Any], bool]]:
    """The one rule for an unanswered tool call, what model providers reject: a tool call
    of an AIMessage that no later ToolMessage answers. Returns (index of the AIMessage,
    call, followed), in order, where ``followed`` says a message other than a ToolMessage
    came after the AIMessage.

    ``messages`` is a message list in any form (see :func:`as_messages`); a list that is
    not all messages has none. ``last_only`` keeps the calls of the last AIMessage: the
    step a run left unfinished, which no model call has followed yet (after an older one,
    a later AIMessage shows the provider in use took that history). The scan stops at
    that AIMessage, so it costs what the last step holds, however long the thread."""
    answered: set[Any] = set()
    found: list[tuple[int, dict[str, Any], bool]] = []
    followed = False
    for i in range(len(messages) - 1, -1, -1):
        m = as_message(messages[i])
        if m is None:
            return []
        if isinstance(m, ToolMessage):
            answered.add(m.tool_call_id)
            continue
        if isinstance(m, AIMessage):
            found += [
                (i, dict(call), followed)
                for call in reversed(m.tool_calls)
                if call.get("id") not in answered
            ]
            if last_only:
                break
        followed = True
    found.reverse()
    return found
