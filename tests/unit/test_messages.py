"""One rule for an unanswered tool call (``_messages.unanswered_calls``), read the same
by the saver's start check (``contract.unanswered_tool_calls``) and by audit and repair,
whatever form the messages are in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_deterministic._messages import as_messages, unanswered_calls
from langgraph_deterministic.checkpointer.contract import unanswered_tool_calls

_SERDE = JsonPlusSerializer()


def ai(*ids: str, text: str = "") -> AIMessage:
    return AIMessage(text, tool_calls=[{"id": i, "name": "tool", "args": {"n": i}} for i in ids])


def tool(call: str) -> ToolMessage:
    return ToolMessage(f"result of {call}", tool_call_id=call)


def as_dict(m: BaseMessage) -> Any:
    role = {"human": "user", "ai": "assistant", "tool": "tool"}[m.type]
    d: dict[str, Any] = {"role": role, "content": m.content}
    if isinstance(m, AIMessage) and m.tool_calls:
        d["tool_calls"] = [dict(c) for c in m.tool_calls]
    if isinstance(m, ToolMessage):
        d["tool_call_id"] = m.tool_call_id
    return d


def as_tuple(m: BaseMessage) -> Any:
    # A (role, content) tuple has no room for tool calls or their ids: those stay dicts.
    return ("user", m.content) if m.type == "human" else as_dict(m)


def as_string(m: BaseMessage) -> Any:
    return m.content if m.type == "human" else m


def as_blocks(m: BaseMessage) -> Any:
    blocks = [{"type": "text", "text": str(m.content) or "-"}]
    return m.model_copy(update={"content": blocks})


def stored(form: Callable[[BaseMessage], Any]) -> Callable[[BaseMessage], Any]:
    """As the serde gives the form back (a tuple reads back as a two-item list)."""
    return lambda m: _SERDE.loads_typed(_SERDE.dumps_typed(form(m)))


FORMS: dict[str, Callable[[BaseMessage], Any]] = {
    "objects": lambda m: m,
    "tuples": as_tuple,
    "stored_tuples": stored(as_tuple),
    "dicts": as_dict,
    "strings": as_string,
    "content_blocks": as_blocks,
}

many = [f"c{i}" for i in range(60)]
# name -> (messages, every unanswered call as (index, id, followed), the start check's ids)
CASES: dict[str, tuple[list[BaseMessage], list[tuple[int, str, bool]], list[str]]] = {
    "a_call_left_unanswered": (
        [HumanMessage("hi"), ai("a", "b"), tool("a")], [(1, "b", False)], ["b"],
    ),
    "input_applied_on_top": ([HumanMessage("hi"), ai("a"), HumanMessage("again")],
                             [(1, "a", True)], ["a"]),
    "a_model_call_came_after": ([ai("z"), ai(text="done")], [(0, "z", True)], []),
    "answered": ([ai("a"), tool("a"), HumanMessage("thanks")], [], []),
    "an_answer_must_follow_its_call": ([tool("a"), ai("a")], [(1, "a", False)], ["a"]),
    "older_damage_and_a_new_step": (
        [ai("x"), HumanMessage("hm"), ai("y", "w"), tool("w")],
        [(0, "x", True), (2, "y", False)], ["y"],
    ),
    # Beyond the 50 messages the start check once looked at.
    "a_wide_last_step": ([HumanMessage("go"), ai(*many), *map(tool, many[:-1])],
                         [(1, "c59", False)], ["c59"]),
    "no_calls": ([HumanMessage("hi"), AIMessage("hello")], [], []),
}  # fmt: skip


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_saver_and_audit_read_the_same_unanswered_calls(form: str, case: str) -> None:
    messages, every, last = CASES[case]
    value = [FORMS[form](m) for m in messages]
    got = [(i, call["id"], followed) for i, call, followed in unanswered_calls(value)]
    assert got == every
    # audit and repair read the coerced list (as_messages): the same answer
    coerced = as_messages(value)
    assert coerced is not None
    assert [(i, c["id"], f) for i, c, f in unanswered_calls(coerced)] == every
    # the saver's start check: the last AI message's unanswered calls, in any list channel
    assert unanswered_tool_calls({"messages": value, "count": 3, "notes": [1, 2]}) == last
    assert [c["id"] for _, c, _ in unanswered_calls(value, last_only=True)] == last


def test_a_list_that_is_not_all_messages_has_no_calls() -> None:
    assert unanswered_calls([ai("a"), 1]) == [] == unanswered_calls([object(), ai("a")])
    assert unanswered_calls([]) == [] and unanswered_tool_calls({"m": []}) == []


def test_the_start_check_reads_only_the_last_step() -> None:
    """What it costs in the saver's hot path: the items after the last AI message and that
    one message are read, not the thread's whole history."""
    read: list[int] = []

    class Spy(list[Any]):
        def __getitem__(self, i: Any) -> Any:
            read.append(i)
            return super().__getitem__(i)

    history = [HumanMessage(str(i)) if i % 2 else AIMessage(str(i)) for i in range(1000)]
    value = Spy([*history, ai("a", "b"), tool("a")])
    assert unanswered_calls(value, last_only=True)[0][1]["id"] == "b"
    assert read == [1001, 1000]
