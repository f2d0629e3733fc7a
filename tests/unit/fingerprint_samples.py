"""Graph inputs of every kind the fingerprint handles, built the same way in any process:
``python -m tests.unit.fingerprint_samples`` prints their fingerprints as JSON."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import uuid
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command, Send
from pydantic import BaseModel

from langgraph_deterministic.checkpointer._fingerprint import input_fingerprint


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Ticket(BaseModel):
    id: int
    tags: list[str]
    opened: dt.datetime


@dataclasses.dataclass
class Order:
    sku: str
    qty: int
    price: decimal.Decimal


def samples() -> dict[str, Any]:
    when = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC)
    return {
        "float": {"x": 0.1, "y": -0.0, "z": 1e300},
        "bytes": {"blob": b"\x00\xffdata", "view": bytearray(b"ab")},
        "uuid": {"id": uuid.UUID("12345678-1234-5678-1234-567812345678")},
        "datetime": {"at": when, "day": when.date(), "time": when.timetz()},
        "decimal": {"amount": decimal.Decimal("19.90")},
        "enum": {"color": Color.RED},
        "send": Command(goto=[Send("work", {"part": 1}), Send("work", {"part": 2})]),
        "pydantic": {"ticket": Ticket(id=7, tags=["a", "b"], opened=when)},
        "dataclass": {"order": Order("sku-1", 2, decimal.Decimal("3.50"))},
        # iteration order of a set of str differs between processes (hash randomisation)
        "set": {"labels": {"alpha", "beta", "gamma", "delta", "epsilon"}},
        "messages": {"messages": [HumanMessage("hi", id="given-id")]},
    }


def fingerprints() -> dict[str, str]:
    return {name: input_fingerprint(value) for name, value in samples().items()}


if __name__ == "__main__":
    print(json.dumps(fingerprints(), sort_keys=True))
