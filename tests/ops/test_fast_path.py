"""The audit's raw-blob fast path never calls a thread with an unanswered tool call
clean: wherever it says "surely answered", decoding with the serde agrees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_deterministic.ops.audit import surely_answered, unanswered_calls

SERDE = JsonPlusSerializer()
ids = st.text(min_size=1, max_size=300)  # fixstr and str8/str16 lengths, any unicode


@st.composite
def conversations(draw: st.DrawFn) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["human", "ai", "calls", "tool"]))
        if kind == "human":
            out.append(HumanMessage(draw(st.text(max_size=20))))
        elif kind == "ai":
            out.append(AIMessage(draw(st.text(max_size=20))))
        elif kind == "calls":
            calls = draw(st.lists(ids, min_size=1, max_size=3))
            out.append(AIMessage("", tool_calls=[{"name": "t", "args": {"id": c}, "id": c} for c in calls]))
            for c in calls:
                if draw(st.booleans()):
                    out.append(ToolMessage(draw(st.text(max_size=10)), tool_call_id=c))
        else:
            out.append(ToolMessage("r", tool_call_id=draw(ids)))
    return out


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_fast_path_agrees_with_the_serde(messages: list[BaseMessage]) -> None:
    _, blob = SERDE.dumps_typed(messages)
    decoded = SERDE.loads_typed(("msgpack", blob))
    if surely_answered(blob):
        assert unanswered_calls(decoded) == []


def test_fast_path_is_taken_for_the_common_shapes() -> None:
    call = AIMessage("", tool_calls=[{"name": "refund", "args": {}, "id": "call_" + "x" * 40}])
    answered = [HumanMessage("hi"), call, ToolMessage("ok", tool_call_id="call_" + "x" * 40)]
    assert surely_answered(SERDE.dumps_typed(answered)[1])
    assert not surely_answered(SERDE.dumps_typed(answered[:2])[1])
