"""The checkpoint and metadata columns' JSON is encoded by orjson where that gives what ``json.dumps``
gives (as Postgres parses it), and by ``json.dumps`` everywhere else: the stored jsonb,
and every refusal, are the same as with psycopg's default encoder. (orjson also encodes a
``uuid.UUID`` and a plain ``enum.Enum``, which json.dumps refuses; neither can reach the
column: it holds LangGraph's ids and versions and only str/int/float/bool/None channel
values, everything else goes to ``checkpoint_blobs``.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from langgraph_deterministic.checkpointer import _rows
from langgraph_deterministic.checkpointer._rows import checkpoint_json, metadata_json


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


@dataclasses.dataclass
class Point:
    x: int


STORED: list[Any] = [
    {"v": 4, "id": "1f1", "channel_values": {"a": 1, "b": "x", "c": 1.5, "d": True}},
    {"channel_versions": {"messages": "00000000000000000000000000000014.0.5095352939"}},
    {"versions_seen": {"n1": {"branch:to:n1": "0001.0.2"}}, "updated_channels": ["a", "b"]},
    {"unicode": "héllo ✓ \U0001f600", "escapes": 'quote " back \\ tab \t nl \n'},
    {"big": 2**63 - 1, "bigger": 2**70, "neg": -(2**63), "floats": [0.1, 1e16, -2.5e-8]},
    {"none": None, "nested": [None, {"n": None}]},
    {"word": "null", "nullable": "nullable"},
    {"channel_values": {"branch:to:n1": None, "x": 1.5, "s": "null"}, "v": None},
    {"channel_values": {"branch:to:n1": None, "branch:to:n2": None}, "v": 4},
    {1: "int key", 2.5: "float key", False: "bool key"},
    {"subclass": Name("s"), "enum": Colour.RED},
    [],
    {},
]

REFUSED: list[Any] = [
    {"nan": math.nan},
    {"inf": [math.inf]},
    {"channel_values": {"branch:to:n1": None, "x": math.nan}},
    {"channel_values": {"branch:to:n1": None}, "versions_seen": {"n1": {"x": -math.inf}}},
    {"when": dt.datetime(2026, 1, 1)},
    {"point": Point(1)},
    {"nul": "a\u0000b"},
    {"surrogate": "\ud800"},
]


ENCODERS = {"checkpoint": checkpoint_json, "metadata": metadata_json}


def _jsonb(conn: psycopg.Connection[Any], param: Jsonb) -> Any:
    row = conn.execute("SELECT %s::jsonb", (param,)).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("column", sorted(ENCODERS))
@pytest.mark.parametrize("value", STORED, ids=range(len(STORED)))
def test_stored_as_json_dumps_stores_it(dsn: str, value: Any, column: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _jsonb(conn, ENCODERS[column](value)) == _jsonb(conn, Jsonb(value))


@pytest.mark.parametrize("column", sorted(ENCODERS))
@pytest.mark.parametrize("value", REFUSED, ids=range(len(REFUSED)))
def test_refused_as_json_dumps_refuses_it(dsn: str, value: Any, column: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            _jsonb(conn, Jsonb(value))
        except (TypeError, ValueError, psycopg.Error) as exc:
            expected: type[BaseException] = type(exc)
        else:
            pytest.fail(f"json.dumps + Postgres accepted {value!r}")
        with pytest.raises(expected):
            _jsonb(conn, ENCODERS[column](value))


def test_fast_path_is_taken_for_langgraph_checkpoints() -> None:
    """A checkpoint whose only nulls are None channel values (LangGraph's branch channels)
    is encoded by orjson (when installed): the cost this is for. Its output parses back
    to what json.dumps encoded."""
    value = STORED[0] | STORED[1] | STORED[2]
    value["channel_values"] = {**value["channel_values"], "branch:to:n1": None}
    data = _rows._dumps_checkpoint(value)
    if _rows.orjson is None:
        pytest.skip("orjson is not installed: json.dumps encodes every checkpoint")
    assert isinstance(data, bytes)
    assert json.loads(data) == json.loads(json.dumps(value))


def test_fast_path_is_taken_for_checkpoint_metadata() -> None:
    """A checkpoint's metadata row (LangGraph's keys, the run id, the fingerprint) is
    encoded by orjson (when installed), and parses back to what json.dumps encoded."""
    value = {"source": "loop", "step": 3, "parents": {"": "1f0"}, "run_id": "r-1",
             "thread_id": "t", "lgd_fingerprint": "input:51e9"}  # fmt: skip
    data = _rows._dumps_metadata(value)
    if _rows.orjson is None:
        pytest.skip("orjson is not installed: json.dumps encodes every metadata row")
    assert isinstance(data, bytes)
    assert json.loads(data) == json.loads(json.dumps(value))
