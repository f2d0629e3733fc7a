"""The statements' text, by job of the core: SQL composed from the named blocks of
``_db/sql/queries.sql`` (fragments filled in, multi-row statements numbered), each shape
built once (``functools.cache``) so that psycopg prepares a bounded set of them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from langgraph_deterministic._db.batch import Statement
from langgraph_deterministic._db.queries import queries

# The WHERE clauses appended to select_checkpoint.
_AT_CHECKPOINT = (
    "\nWHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = %(checkpoint_ns)s"
    " AND c.checkpoint_id = %(checkpoint_id)s"
)
_LATEST = (
    "\nWHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = %(checkpoint_ns)s"
    "\nORDER BY c.checkpoint_id DESC LIMIT 1"
)


@cache
def _list_sql() -> str:
    """select_checkpoint over the page of checkpoints only: the rows are chosen, sorted
    and cut to ``limit`` first, and only they get their blobs and writes. Joined before
    the sort, every matching checkpoint's blobs would be loaded and sorted (a thread's
    whole history for a list without checkpoint_ns, all of them for a global filter)."""
    page = queries()["list_page"]
    select = queries()["select_checkpoint"]
    source = "FROM checkpoints c\n"
    assert source in select, "select_checkpoint must read `FROM checkpoints c`"
    return select.replace(source, f"FROM ({page}) c\n", 1) + "\nORDER BY c.checkpoint_id DESC"


@cache
def _start_read_sql(name: str) -> str:
    """A graph run's start read (select_head_with_run, select_addressed_with_run) with
    its fragments filled: the checkpoint (select_checkpoint) and the sweep's tombstones
    (swept)."""
    q = queries()
    return q[name].replace("{select_checkpoint}", q["select_checkpoint"]).replace(
        "{swept}", q["swept"]
    )


def _riding(statement: Statement) -> Statement:
    """A fenced pending write sent before its checkpoint's child in the child's
    transaction, without its own lease check: the child's lgd_put_checkpoint_v6 checks the
    same lease later in that transaction and refuses (LG413) what it would, rolling the
    writes back with it. The chain fence stays: its LG410/LG412 must come first."""
    sql = _riders().get(statement.sql)
    return statement if sql is None else dataclasses.replace(statement, sql=sql)


@cache
def _riders() -> dict[str, str]:
    riders = {_block("guarded_write"): _block("riding_write")}
    for n in range(1, ROWS_MAX + 1):
        riders[_rows_sql("guarded_writes", "write_row", n)] = _rows_sql(
            "riding_writes", "write_row", n
        )
    return riders


#: Blocks composed of another: riding_write(s) are guarded_write(s) without the lease probe.
_RIDING = {"riding_write": "guarded_write", "riding_writes": "guarded_writes"}


@cache
def _block(name: str) -> str:
    """A queries.sql block, its ``{lease_probe}`` (guarded_write, guarded_writes) filled
    with the block lease_probe, or left empty for their riding twins (see _riding)."""
    q = queries()
    text = q[_RIDING.get(name, name)]
    return text.replace("{lease_probe}", "" if name in _RIDING else " " + q["lease_probe"])


#: Rows per multi-row statement (insert_blobs, insert_writes, guarded_writes): more rows
#: go in further statements, so only ROWS_MAX shapes of each are ever prepared.
ROWS_MAX = 8
_PARAM = re.compile(r"%\((\w+)\)s")


def _chunks(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [rows[i : i + ROWS_MAX] for i in range(0, len(rows), ROWS_MAX)]


@cache
def _rows_sql(block: str, row: str, n: int) -> str:
    """``block`` with its ``{rows}`` filled by ``n`` copies of the ``row`` block, the
    parameters of the i-th copy suffixed ``_i`` (see :func:`_numbered`)."""
    template = queries()[row]
    values = ",\n".join(_PARAM.sub(rf"%(\1_{i})s", template) for i in range(n))
    return _block(block).replace("{rows}", values)


@cache
def _put_sql(put: str, blobs: int) -> str:
    """``put`` (a block) carrying ``blobs`` blob rows in a CTE."""
    q = queries()
    if not blobs:
        return q[put]
    cte = q["blobs_cte"].replace("{insert_blobs}", _rows_sql("insert_blobs", "blob_row", blobs))
    return q["put_with"].replace("{ctes}", cte).replace("{put}", q[put])


def _numbered(rows: Sequence[Mapping[str, Any]], shared: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of a multi-row statement: ``shared`` plus each row's, suffixed."""
    params = dict(shared)
    for i, row in enumerate(rows):
        for key, value in row.items():
            params[f"{key}_{i}"] = value
    return params
