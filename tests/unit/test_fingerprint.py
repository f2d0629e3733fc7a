"""Input fingerprints (``checkpointer/_fingerprint.py``): equal for equal inputs, different
for different ones, for every kind of value a graph input holds, and the same in another
process: a retry runs in a new worker, and a fingerprint that moved with hash
randomisation or object identity would refuse a genuine retry (RunInputMismatchError)."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import decimal
import enum
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command, Send
from pydantic import BaseModel

from langgraph_deterministic.checkpointer._fingerprint import input_fingerprint

from .fingerprint_samples import Color, Order, Ticket, fingerprints, samples

ROOT = Path(__file__).resolve().parents[2]
WHEN = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC)


def fp(value: Any) -> str:
    return input_fingerprint(value)


@pytest.mark.parametrize("name", sorted(samples()))
def test_equal_inputs_built_twice_have_one_fingerprint(name: str) -> None:
    first, second = samples()[name], samples()[name]
    assert fp(first) == fp(second) == fp(copy.deepcopy(first))
    assert fp(first).startswith("command:" if name == "send" else "input:")


def test_fingerprints_are_the_same_in_other_processes() -> None:
    here = fingerprints()
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-m", "tests.unit.fingerprint_samples"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert json.loads(done.stdout) == here, f"PYTHONHASHSEED={seed}"


# Pinned: the canonical form is part of the stored data (metadata.input_fingerprint). If
# one of these moves, a retry on a worker of the new version of a run that a worker of
# the old version started is refused as another input (RunInputMismatchError) during a
# rolling deploy. Only values whose form is ours alone (no pydantic/LangChain dump).
PINNED = {
    "bytes": "input:f770eb76c75be58b8908ba15df3a3589",
    "dataclass": "input:5dbe6d4eacecb3fd5c4503ff1a4eebdf",
    "datetime": "input:664b60b395fd03c38312a33d2197fdba",
    "decimal": "input:101e3059e8a16846a7a835cc527cbbee",
    "enum": "input:5e0948201e644c12ac8783edfc8256b6",
    "float": "input:435408c70646719b52f8733a45421be3",
    "send": "command:830e33fd6585e96cd4c7dbf323991164",
    "set": "input:8b087e7ed263b3b49fca01e9379b142d",
    "uuid": "input:b1299024310951665652e1537d214ba0",
}


def test_fingerprints_of_our_own_canonical_forms_do_not_move() -> None:
    assert {k: v for k, v in fingerprints().items() if k in PINNED} == PINNED


def test_kinds_of_value_are_told_apart() -> None:
    distinct = [
        1, 1.0, "1", True, b"1", decimal.Decimal("1"), [1], {"1": 1}, None,
        uuid.UUID(int=1), str(uuid.UUID(int=1)), WHEN, WHEN.isoformat(), WHEN.date(),
        Color.RED, "red", {"color": "red"},
    ]  # fmt: skip
    prints = [fp({"v": v}) for v in distinct]
    assert len(set(prints)) == len(distinct), [
        (a, b)
        for i, a in enumerate(distinct)
        for b in distinct[i + 1 :]
        if fp({"v": a}) == fp({"v": b})
    ]


def test_changes_inside_each_kind_change_the_fingerprint() -> None:
    pairs = [
        (0.1, 0.1000000001),
        (b"\x00", b"\x01"),
        (uuid.UUID(int=1), uuid.UUID(int=2)),
        (WHEN, WHEN + dt.timedelta(microseconds=1)),
        (WHEN, WHEN.replace(tzinfo=None)),  # aware vs naive
        (decimal.Decimal("19.90"), decimal.Decimal("19.91")),
        (Color.RED, Color.BLUE),
        (Send("work", 1), Send("other", 1)),
        (Send("work", 1), Send("work", 2)),
        (Ticket(id=1, tags=[], opened=WHEN), Ticket(id=2, tags=[], opened=WHEN)),
        (Order("a", 1, decimal.Decimal(1)), Order("a", 2, decimal.Decimal(1))),
    ]
    for a, b in pairs:
        assert fp({"v": a}) != fp({"v": b}), (a, b)


def test_same_fields_under_another_type_are_another_input() -> None:
    @dataclasses.dataclass
    class Other:
        sku: str
        qty: int
        price: decimal.Decimal

    class OtherTicket(BaseModel):
        id: int
        tags: list[str]
        opened: dt.datetime

    order = Order("a", 1, decimal.Decimal(1))
    assert fp(order) != fp(Other("a", 1, decimal.Decimal(1)))
    assert fp(order) != fp(dataclasses.asdict(order))
    ticket = Ticket(id=1, tags=["x"], opened=WHEN)
    assert fp(ticket) != fp(OtherTicket(id=1, tags=["x"], opened=WHEN))
    assert fp(ticket) != fp(ticket.model_dump())

    class Shade(enum.Enum):
        RED = "red"

    assert fp(Color.RED) != fp(Shade.RED)


def test_order_of_dict_keys_and_set_items_does_not_matter() -> None:
    assert fp({"a": 1, "b": [1, 2]}) == fp({"b": [1, 2], "a": 1})
    assert fp({"s": {3, 1, 2}}) == fp({"s": {2, 3, 1}})
    assert fp([1, 2]) != fp([2, 1])  # a list's order is its content


def test_message_ids_langgraph_assigns_do_not_count() -> None:
    assert fp({"messages": [HumanMessage("hi", id="a")]}) == fp({"messages": [HumanMessage("hi")]})
    assert fp({"messages": [HumanMessage("hi")]}) != fp({"messages": [HumanMessage("ho")]})


def test_commands_are_their_own_kind() -> None:
    assert fp(Command(resume="yes")).startswith("command:")
    assert fp(Command(resume="yes")) != fp(Command(resume="no"))
    assert fp(Command(goto=Send("a", 1))) != fp(Command(goto="a"))
    assert fp(None).startswith("none:")


def test_unfingerprintable_values_raise_type_error() -> None:
    with pytest.raises(TypeError, match="cannot fingerprint a object"):
        fp({"v": object()})
    deep: Any = []
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper than 64"):
        fp(deep)
