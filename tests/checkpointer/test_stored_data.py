"""Stored data never runs code: rows crafted by hand to name a callable (every msgpack
extension kind, a pickle, a JSON ``lc: 2`` constructor) are refused with our error in
reads, graph runs, ``audit`` and ``repair``, and nothing they name runs; every type of
ours, LangGraph's and LangChain's still round-trips; a registered type works."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import ormsgpack
import psycopg
import pytest
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import Generation
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Interrupt, Send
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_deterministic import (
    ConfigurationError,
    DeterministicError,
    DeterministicSaver,
    SafeSerializer,
    UnsafeDataError,
    run_config,
)
from langgraph_deterministic._serde import guarded_loads
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops.audit import audit
from langgraph_deterministic.ops.repair import repair

HERE = __name__


def plant_file(path: str, *_: Any, **__: Any) -> None:
    """What an attacker's row would run: here it only leaves a file behind."""
    Path(path).write_text("ran")


class Planter:
    def __init__(self, path: str = "", **_: Any) -> None:
        plant_file(path)

    @classmethod
    def create(cls, path: str) -> Planter:
        return cls(path)


class PickleBomb:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (plant_file, (self.path, b"\xa9tool_call"))


def _ext(code: int, payload: Any) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(payload))


def _msgpack(value: Any) -> tuple[str, bytes]:
    # "tool_call" in the blob: audit decodes a head's messages only when it holds one
    return "msgpack", ormsgpack.packb([value, "tool_call"])


CRAFTED: dict[str, Callable[[str], tuple[str, bytes]]] = {
    "constructor": lambda p: _msgpack(_ext(0, [HERE, "plant_file", p])),
    "constructor_args": lambda p: _msgpack(_ext(1, [HERE, "plant_file", [p]])),
    "constructor_kwargs": lambda p: _msgpack(_ext(2, [HERE, "plant_file", {"path": p}])),
    "method": lambda p: _msgpack(_ext(3, [HERE, "Planter", p, "create"])),
    "pydantic_v1": lambda p: _msgpack(_ext(4, [HERE, "Planter", {"path": p}])),
    "pydantic_v2": lambda p: _msgpack(_ext(5, [HERE, "Planter", {"path": p}, None])),
    "nested_in_a_message": lambda p: _msgpack(
        _ext(
            2,
            [
                "langchain_core.messages.human",
                "HumanMessage",
                {"content": "hi", "additional_kwargs": {"x": _ext(0, [HERE, "plant_file", p])}},
            ],
        )
    ),
    "pickle": lambda p: ("pickle", pickle.dumps(PickleBomb(p))),
    "json_constructor": lambda p: (
        "json",
        json.dumps(
            {"lc": 2, "type": "constructor", "id": [*HERE.split("."), "plant_file"],
             "kwargs": {"path": p, "note": "\u00a9tool_call"}},
            ensure_ascii=False,
        ).encode(),
    ),
}

# What would load each crafted blob and so run it: the peer's default, or the opt-ins.
PERMISSIVE = {
    "pickle": JsonPlusSerializer(pickle_fallback=True),
    "json_constructor": JsonPlusSerializer(allowed_json_modules=True),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_the_crafted_blobs_do_run_code_under_a_permissive_serde(kind: str, tmp_path: Path) -> None:
    """The control: each blob is a real exploit where the serializer allows it (a method
    call LangGraph blocks in every mode: only its own datetime.fromisoformat runs)."""
    marker = tmp_path / "ran"
    type_, blob = CRAFTED[kind](str(marker))
    PERMISSIVE.get(kind, JsonPlusSerializer()).loads_typed((type_, blob))
    assert marker.exists() is (kind != "method")


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_the_default_serde_refuses_them_and_runs_nothing(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    type_, blob = CRAFTED[kind](str(marker))
    with pytest.raises(UnsafeDataError, match=r"allow-list|pickle") as err:
        guarded_loads(SafeSerializer(), type_, blob)
    if kind != "pickle":
        assert "plant_file" in str(err.value) or "Planter" in str(err.value)
        assert "allowed_types=" in str(err.value)
    else:
        assert "pickle_fallback=True" in str(err.value) and "run code" in str(err.value)
    assert not marker.exists()


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _graph(saver: DeterministicSaver) -> Any:
    def reply(state: State) -> dict[str, Any]:
        return {"messages": [AIMessage("ok")]}

    return StateGraph(State).add_node(reply).add_edge(START, "reply").compile(checkpointer=saver)


def _plant(dsn: str, thread_id: str, type_: str, blob: bytes) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = conn.execute(
            "UPDATE checkpoint_blobs SET type = %s, blob = %s WHERE thread_id = %s "
            "AND channel = 'messages'",
            (type_, blob, thread_id),
        ).rowcount
    assert n >= 1


@pytest.fixture(scope="module")
def saver(db: str) -> Iterator[DeterministicSaver]:
    with DeterministicSaver(db) as s:
        yield s


@pytest.mark.parametrize("kind", sorted(CRAFTED))
async def test_no_code_runs_in_reads_runs_audit_or_repair(
    kind: str, db: str, saver: DeterministicSaver, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    marker = tmp_path / "ran"
    graph = _graph(saver)
    tid, clean = f"crafted-{kind}", f"clean-{kind}"
    for t in (tid, clean):
        graph.invoke({"messages": [("user", "hi")]}, run_config(t, f"{t}-1"))
    _plant(db, tid, *CRAFTED[kind](str(marker)))
    config = run_config(tid, f"{tid}-2")

    reads: list[Callable[[], Any]] = [
        lambda: saver.get_tuple(config),
        lambda: list(saver.list(config)),
        lambda: graph.get_state(config),
        lambda: list(graph.get_state_history(config)),
        lambda: graph.invoke({"messages": [("user", "again")]}, config),
    ]
    for read in reads:
        with pytest.raises(UnsafeDataError, match=re.escape(repr(tid))):
            read()
    with pytest.raises(UnsafeDataError):
        await saver.aget_tuple(config)
    with pytest.raises(UnsafeDataError):
        await graph.ainvoke({"messages": [("user", "again")]}, config)

    found = audit(db, thread_id=tid)
    assert {f.fault for f in found.findings} == {"unreadable"}, found.findings
    for apply in (False, True):
        fixed = repair(db, thread_id=tid, apply=apply)
        assert [t.thread_id for t in fixed.threads] == [tid]
        assert fixed.threads[0].refused and "cannot be read" in fixed.threads[0].refused
        assert not fixed.threads[0].applied
    assert main(["audit", "--dsn", db, "--thread", tid, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["unreadable_threads"] == [tid]
    assert not marker.exists()
    # the thread beside it keeps working
    out = graph.invoke({"messages": [("user", "more")]}, run_config(clean, f"{clean}-2"))
    assert [m.content for m in out["messages"]][-1] == "ok"


class Drafting(TypedDict):
    draft: Generation


@dataclasses.dataclass
class Mine:
    name: str
    n: int


ROUND_TRIPS: dict[str, Any] = {
    "messages": [
        HumanMessage("h", id="1"),
        AIMessage("", id="2", tool_calls=[{"name": "t", "args": {"a": 1}, "id": "c1"}]),
        ToolMessage("r", tool_call_id="c1", id="3"),
        SystemMessage("s", id="4"),
        ChatMessage("c", role="critic", id="5"),
        FunctionMessage("f", name="fn", id="6"),
        RemoveMessage(id="7"),
        AIMessageChunk("chunk", id="8"),
        HumanMessageChunk("hchunk", id="9"),
    ],
    "document": Document("text", metadata={"k": "v"}, id="d1"),
    "send": Send("node", {"x": 1}),
    "command": Command(goto="node", update={"x": 1}, resume="yes"),
    "interrupt": Interrupt(value={"q": "?"}, id="i1"),
    "stdlib": [
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), date(2024, 1, 2), timedelta(seconds=3),
        uuid.UUID(int=7), Decimal("1.5"), {1, 2}, frozenset({3}), deque([4]), Path("/tmp/x"),
        re.compile("a+"),
    ],
}


def _put_get(saver: DeterministicSaver, thread_id: str, value: Any) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": value}
    checkpoint["channel_versions"] = {"v": "00000000000000000000000000000001.0"}
    config = saver.put(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
        checkpoint, {"source": "update", "step": 0}, checkpoint["channel_versions"],
    )  # fmt: skip
    found = saver.get_tuple(config)
    assert found is not None
    return found.checkpoint["channel_values"]["v"]


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_every_type_of_langchain_and_langgraph_round_trips(db: str, name: str) -> None:
    with DeterministicSaver(db, run_id_policy="off") as saver:
        assert _put_get(saver, f"rt-{name}", ROUND_TRIPS[name]) == ROUND_TRIPS[name]


@pytest.mark.parametrize("form", [Mine, (HERE, "Mine")])
def test_a_registered_type_round_trips_and_an_unregistered_one_is_refused(
    db: str, form: Any
) -> None:
    with (
        DeterministicSaver(db, run_id_policy="off") as saver,
        pytest.raises(UnsafeDataError, match=r"Mine.*allowed_types=\[Mine\]"),
    ):
        _put_get(saver, "mine-refused", Mine("a", 1))
    with DeterministicSaver(db, run_id_policy="off", allowed_types=[form]) as saver:
        assert _put_get(saver, f"mine-{form!r}", Mine("a", 1)) == Mine("a", 1)


def test_allowed_types_with_a_serde_of_ones_own_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="SafeSerializer"):
        DeterministicSaver("postgresql://x@127.0.0.1:1/x", serde=SafeSerializer(), allowed_types=[Mine])


def test_a_journaled_error_never_imports_a_module(tmp_path: Path) -> None:
    from langgraph_deterministic.runner._postgres import _load_error

    blob = json.dumps(
        {"module": "antigravity", "qualname": "x", "args": [], "message": "m"}
    ).encode()
    import sys

    assert "antigravity" not in sys.modules
    err = _load_error(blob)
    assert isinstance(err, DeterministicError) and "antigravity" not in sys.modules


def test_under_langgraph_strict_msgpack_compile_registers_the_state_schema_types(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LANGGRAPH_STRICT_MSGPACK=true (read at import: patched here) makes compile() add
    the state schema's types to the checkpointer's allow-list; it does with this saver."""
    from langgraph._internal import _serde as lg_serde

    def write(state: Drafting) -> dict[str, Any]:
        return {"draft": Generation(text="hi")}

    builder = StateGraph(Drafting).add_node(write).add_edge(START, "write")
    with DeterministicSaver(db) as saver:
        config = run_config("strict-schema", "r1")
        builder.compile(checkpointer=saver).invoke({"draft": Generation(text="x")}, config)
        with pytest.raises(UnsafeDataError, match="Generation"):
            builder.compile(checkpointer=saver).get_state(config)
        monkeypatch.setattr(lg_serde, "STRICT_MSGPACK_ENABLED", True)
        graph = builder.compile(checkpointer=saver)
        assert graph.get_state(config).values == {"draft": Generation(text="hi")}


class PydanticState(BaseModel):
    question: str
    answer: str = ""
    messages: list[AnyMessage] = []


@dataclasses.dataclass
class DataclassState:
    question: str
    answer: str = ""
    messages: list[AnyMessage] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize("schema", [PydanticState, DataclassState])
def test_pydantic_and_dataclass_state_schemas_need_no_registration(db: str, schema: Any) -> None:
    """LangGraph stores a schema's fields one by one: plain values and messages, all on
    the list (only a field whose value is a model of yours needs allowed_types)."""

    def answer(state: Any) -> dict[str, Any]:
        return {"answer": "42", "messages": [HumanMessage(state.question), AIMessage("42")]}

    builder = StateGraph(schema).add_node(answer).add_edge(START, "answer")
    with DeterministicSaver(db) as saver:
        graph = builder.compile(checkpointer=saver)
        config = run_config(f"schema-{schema.__name__}", "r1")
        graph.invoke({"question": "why"}, config)
        values = graph.get_state(config).values
        assert values["answer"] == "42" and values["messages"][-1].content == "42"
