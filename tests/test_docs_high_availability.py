"""docs/how-to/high-availability.md as written: its snippets run, in order, against a real
primary and streaming standby (``devtools/replica.py``), with the page's DSN pointed at
them; graph runs on both savers the page builds (its DSN one and its pool one) finish
through its retry loop while the primary is stopped and the standby promoted; and the
error table's "retryable" column is what ``is_retryable`` says."""

from __future__ import annotations

import contextlib
import operator
import re
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import END, START, StateGraph
from psycopg.conninfo import conninfo_to_dict
from typing_extensions import TypedDict

import langgraph_deterministic.errors as errors
from langgraph_deterministic import DeterministicSaver

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "high-availability.md"
TEXT = DOC.read_text("utf-8")
PLACEHOLDER = "host=db1.internal,db2.internal port=5432,5432 dbname=app user=app"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TEXT, flags=re.DOTALL)


def test_the_dsn_names_every_host_and_asks_for_the_primary() -> None:
    namespace: dict[str, Any] = {}
    exec(_python_blocks()[0], namespace)  # builds a saver; connects to nothing yet
    params = conninfo_to_dict(namespace["DSN"])
    assert params["target_session_attrs"] == "read-write"
    assert params["host"].count(",") == 1 and params["port"].count(",") == 1
    assert isinstance(namespace["saver"], DeterministicSaver)
    assert PLACEHOLDER in namespace["DSN"]


def test_the_error_table_says_what_is_retryable() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (yes|no) \|", TEXT, flags=re.MULTILINE)
    assert len(rows) == 4
    for name, retryable in rows:
        cls = getattr(errors, name)
        assert errors.is_retryable(cls("x")) is (retryable == "yes"), name


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


@pytest.fixture
def pair() -> Any:
    from devtools.postgres import _find_binaries
    from devtools.replica import start_replica_pair

    try:
        _find_binaries()
    except errors.ConfigurationError as exc:
        pytest.skip(f"no PostgreSQL server binaries for a replica: {exc}")
    with start_replica_pair("sync") as pair:
        yield pair


def test_the_snippets_carry_runs_through_a_failover(pair: Any) -> None:
    dsn = pair.create_database("ha_docs")
    hosts = " ".join(
        f"{k}={v}"
        for k, v in conninfo_to_dict(dsn).items()
        if k in ("host", "port", "dbname", "user")
    )
    namespace: dict[str, Any] = {}
    for block in _python_blocks():
        exec(block.replace(PLACEHOLDER, hosts), namespace)
    saver, pool = namespace["saver"], namespace["pool"]
    invoke_with_retries = namespace["invoke_with_retries"]
    pool.open(wait=True)
    in_node = threading.Barrier(3)

    entered: set[str] = set()

    def slow(state: S) -> S:
        first_time = state["log"][0] not in entered
        entered.add(state["log"][0])
        if first_time:
            with contextlib.suppress(threading.BrokenBarrierError):
                in_node.wait(10)  # both runs are inside a node when the primary goes
            time.sleep(0.3)
        return {"log": ["slow"]}

    g = StateGraph(S)
    g.add_node("first", lambda s: {"log": ["first"]})
    g.add_node("slow", slow)
    g.add_edge(START, "first")
    g.add_edge("first", "slow")
    g.add_edge("slow", END)
    results: dict[str, Any] = {}
    try:
        with saver:
            saver.setup()
            pair.wait_caught_up()
            graphs = {
                "dsn": g.compile(checkpointer=saver),
                "pool": g.compile(checkpointer=namespace["saver_on_pool"]),
            }

            def run(name: str) -> None:
                try:
                    results[name] = invoke_with_retries(
                        graphs[name], {"log": [f"in:{name}"]}, f"thread-{name}", "run-1"
                    )
                except BaseException as exc:
                    results[name] = exc

            workers = [threading.Thread(target=run, args=(n,)) for n in graphs]
            for w in workers:
                w.start()
            try:
                in_node.wait(30)
            except threading.BrokenBarrierError:
                for w in workers:
                    w.join(30)
                raise AssertionError(f"the runs did not reach the node: {results}") from None
            pair.failover()
            for w in workers:
                w.join(120)
    finally:
        pool.close()
    for name in ("dsn", "pool"):
        assert results[name] == {"log": [f"in:{name}", "first", "slow"]}, results[name]
