"""The audit's CPU priority. By default the audit leaves every process's scheduling as it
is; with ``priority="idle"`` (``--priority idle``) its own thread and, where the server
runs on this machine, its server backend run at SCHED_IDLE while it scans, so that live
workers preempt it at once (the effect on their latency: benchmarks/bench_audit.py). The
policy is read from /proc while the audit runs, from its progress callback."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from benchmarks import fault_db

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops import _priority
from langgraph_deterministic.ops.audit import audit

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc are Linux's"
)

SCHED_IDLE = 5  # the policy number /proc/<pid>/stat shows (field 41)


def _policy(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[38])


def _in_idle_group(task: str) -> bool:
    """Whether /proc/<task>/cgroup puts it in the idle cgroup (cpu hierarchy)."""
    return f"/{_priority.IDLE_CGROUP}" in Path(f"/proc/{task}/cgroup").read_text()


# where the machine lets us make the idle cgroup (root here), the audit uses it too
GROUPED = _priority._idle_group() is not None
GOT = f"idle, cgroup {_priority.IDLE_CGROUP}" if GROUPED else "idle"


@pytest.fixture()
def planted(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_prio")
    try:
        fault_db.build(dsn, threads=60, planted=1, runs=2)
        yield dsn
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


class _Watch:
    """A progress callback recording (the audit backend's policy, the audit thread's)."""

    def __init__(self, dsn: str) -> None:
        self.seen: list[tuple[int, int]] = []
        self.grouped: list[tuple[bool, bool]] = []  # (backend, audit thread) in the idle group
        self.conn = psycopg.connect(dsn, autocommit=True)

    def __call__(self, done: int, total: int | None) -> None:
        row = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'langgraph-deterministic ops'"
        ).fetchone()
        assert row is not None
        self.seen.append((_policy(row[0]), os.sched_getscheduler(0)))
        me = f"{os.getpid()}/task/{threading.get_native_id()}"
        self.grouped.append((_in_idle_group(str(row[0])), _in_idle_group(me)))


def test_idle_priority_runs_the_audit_and_a_local_backend_at_idle(planted: str) -> None:
    before = os.sched_getscheduler(0)
    me = f"{os.getpid()}/task/{threading.get_native_id()}"
    group_before = Path(f"/proc/{me}/cgroup").read_text()
    watch = _Watch(planted)
    with watch.conn:
        # At SCHED_IDLE the backend gets only CPU nobody else wants: on a busy machine (CI
        # beside other jobs) a range can take far longer than the 5 s default. This test is
        # about who runs at which priority, not how fast, so the timeout is out of the way.
        report = audit(planted, pause=0.0, batch_rows=300, progress=watch, priority="idle",
                       statement_timeout_ms=600_000)  # fmt: skip
    assert report.priority == report.backend_priority == GOT
    assert report.to_json()["backend_priority"] == GOT
    assert watch.seen and all(p == (SCHED_IDLE, SCHED_IDLE) for p in watch.seen)
    assert all(g == (GROUPED, GROUPED) for g in watch.grouped)
    # the caller's thread is given back its policy and its group
    assert os.sched_getscheduler(0) == before
    assert Path(f"/proc/{me}/cgroup").read_text() == group_before


@pytest.mark.parametrize("priority", [None, "normal"], ids=["default", "normal"])
def test_by_default_the_audit_leaves_both_alone(planted: str, priority: str | None) -> None:
    watch = _Watch(planted)
    chosen = {} if priority is None else {"priority": priority}
    with watch.conn:
        report = audit(planted, pause=0.0, batch_rows=300, progress=watch, **chosen)  # type: ignore[arg-type]
    assert report.priority == report.backend_priority == "normal"
    assert watch.seen and all(SCHED_IDLE not in p for p in watch.seen)
    assert not any(b or t for b, t in watch.grouped)
    with pytest.raises(ValueError, match="priority"):
        audit(planted, priority="low")  # type: ignore[arg-type]


def test_a_pid_is_taken_for_the_backend_only_when_its_start_matches(planted: str) -> None:
    assert _priority._started_at(os.getpid()) is None  # not a postgres
    with psycopg.connect(planted, autocommit=True) as conn:
        pid, started = conn.execute(
            "SELECT pid, extract(epoch FROM backend_start)::float8 FROM pg_stat_activity "
            "WHERE pid = pg_backend_pid()"
        ).fetchone()  # type: ignore[misc]
        at = _priority._started_at(pid)
        assert at is not None and abs(at - started) <= _priority._START_SLACK_S
        assert _priority.idle_backend(conn) == GOT
        assert _policy(pid) == SCHED_IDLE and _in_idle_group(str(pid)) == GROUPED


def test_cli_priority_option(planted: str, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["audit", "--dsn", planted, "--json", "--pause", "0"]) == 1
    assert json.loads(capsys.readouterr().out)["backend_priority"] == "normal"
    assert main(["audit", "--dsn", planted, "--json", "--pause", "0", "--priority", "idle"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["priority"] == out["backend_priority"] == GOT
    assert main(["audit", "--dsn", planted, "--priority", "low"]) == 2
