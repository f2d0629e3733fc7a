"""The audit's pace: a fixed --pause, or (the default) automatic: full speed while the
database is quiet, a duty cycle on its own statement time while live workers write (WAL
grows); ranges sized towards a short statement; no temp file written.
The effect on live workers' latency is measured by benchmarks/bench_audit.py, not here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from benchmarks import fault_db

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops import audit as audit_module
from langgraph_deterministic.ops.audit import (
    _MIN_BATCH_ROWS,
    AUTO_BUSY_WAL_BYTES_PER_S,
    RANGE_TARGET_S,
    Pacer,
    _next_rows,
    audit,
)


def test_fixed_pause_is_kept_whatever_the_load() -> None:
    pacer = Pacer(0.3)
    assert [pacer.wait_after(2.0, w, 1.0) for w in (0, 10**9, None)] == [0.3, 0.3, 0.3]
    assert Pacer(0.0).wait_after(2.0, 10**9, 1.0) == 0.0  # --pause 0: full speed
    with pytest.raises(ValueError):
        Pacer(-1.0)


def test_automatic_pace_runs_full_speed_when_quiet_and_keeps_its_duty_when_busy() -> None:
    pacer = Pacer(duty=0.5)
    busy = int(AUTO_BUSY_WAL_BYTES_PER_S * 2)  # in the 2 s interval below: just busy
    assert pacer.wait_after(0.4, 0, 2.0) == 0.0
    assert pacer.wait_after(0.4, busy - 1, 2.0) == 0.0
    assert pacer.wait_after(0.4, busy, 2.0) == pytest.approx(0.4)  # as long as the range
    assert pacer.wait_after(0.1, None, 2.0) == pytest.approx(0.1)  # WAL unreadable: careful
    assert pacer.busy_ranges == 2 and pacer.waited == pytest.approx(0.5)
    assert Pacer(duty=0.25).wait_after(0.1, busy, 2.0) == pytest.approx(0.3)
    assert Pacer().wait_after(0.1, busy, 2.0) == pytest.approx(0.3)  # the default: 0.25


def test_the_pace_says_when_to_assume_live_workers() -> None:
    busy = int(AUTO_BUSY_WAL_BYTES_PER_S * 2) + 1
    pacer = Pacer()
    assert pacer.live  # before the first range: careful
    pacer.wait_after(0.1, 0, 2.0)
    assert not pacer.live
    pacer.wait_after(0.1, busy, 2.0)
    assert pacer.live
    pacer.wait_after(0.1, None, 2.0)  # WAL unreadable
    assert pacer.live
    assert Pacer(0.3).live and not Pacer(0.0).live  # a fixed pause: live unless full speed


def test_ranges_are_sized_towards_a_short_statement() -> None:
    t = RANGE_TARGET_S
    assert _next_rows(4000, t, 20_000) == 4000  # on target: kept
    assert _next_rows(4000, t / 4, 20_000) == 8000  # fast: grows, at most twice a range
    assert _next_rows(4000, t * 1.25, 20_000) == 3200
    assert _next_rows(4000, t * 10, 20_000) == 2000  # slow: shrinks, at most by half a range
    assert _next_rows(16_000, t / 10, 20_000) == 20_000  # never past batch_rows
    assert _next_rows(_MIN_BATCH_ROWS, t * 10, 20_000) == _MIN_BATCH_ROWS
    assert _next_rows(1000, t * 10, 100) == 100  # batch_rows below the floor wins


def _temp_files(dsn: str) -> int:
    """Temp files this database's backends wrote, once the audit's backend has exited (a
    backend reports its statistics when it exits)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(100):
            gone = conn.execute(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = "
                "current_database() AND application_name = 'langgraph-deterministic ops')"
            ).fetchone()
            if gone and gone[0]:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        row = conn.execute(
            "SELECT temp_files FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_audit_writes_no_temp_file_even_for_big_ranges(
    pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = create_database(pg_server_dsn, prefix="lgd_temp")
    try:
        expected = fault_db.build(dsn, threads=700, planted=2, runs=8)  # 28,000 checkpoints
        # one range of 20,000 checkpoints whatever the statement time
        monkeypatch.setattr(audit_module, "RANGE_TARGET_S", 1e6)
        monkeypatch.setattr(audit_module, "_MIN_BATCH_ROWS", 20_000)
        before = _temp_files(dsn)
        report = audit(dsn, pause=0.0, batch_rows=20_000)
        assert _found(report) == {t: set(e) for t, e in expected.items() if e}
        assert _temp_files(dsn) == before
        # the control: the same range with a small work_mem spills, so the count above
        # would have seen a spill (PostgreSQL 18 no longer spills this range at 4 MB)
        monkeypatch.setattr(audit_module, "AUDIT_WORK_MEM", "256kB")
        audit(dsn, pause=0.0, batch_rows=20_000)
        assert _temp_files(dsn) > before
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


@pytest.fixture()
def planted(pg_server_dsn: str) -> Iterator[tuple[str, dict[str, frozenset[str]]]]:
    dsn = create_database(pg_server_dsn, prefix="lgd_pace")
    try:
        yield dsn, fault_db.build(dsn, threads=60, planted=1, runs=2)
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def _found(report: object) -> dict[str, set[str]]:
    return {t: {f.fault for f in fs} for t, fs in report.by_thread().items()}  # type: ignore[attr-defined]


def test_audit_paces_itself_beside_a_live_writer(
    planted: tuple[str, dict[str, frozenset[str]]],
) -> None:
    dsn, expected = planted
    alone = audit(dsn, pause=0.0, batch_rows=300)
    assert alone.paused_seconds == 0.0
    stop = threading.Event()

    def writer() -> None:  # a live worker: WAL grows far faster than the busy threshold
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS pace_load (x text)")
            while not stop.is_set():
                conn.execute(
                    "INSERT INTO pace_load SELECT md5(random()::text) FROM generate_series(1, 200)"
                )

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        paced = audit(dsn, batch_rows=300)  # the default: automatic
    finally:
        stop.set()
        thread.join()
    assert paced.paused_seconds > 0
    assert _found(paced) == _found(alone) == {t: set(e) for t, e in expected.items() if e}


def test_cli_pause_option(planted: tuple[str, dict[str, frozenset[str]]]) -> None:
    dsn, _ = planted
    assert main(["audit", "--dsn", dsn, "--pause", "0"]) == 1  # damage planted
    assert main(["audit", "--dsn", dsn, "--pause", "0.01"]) == 1
    assert main(["audit", "--dsn", dsn, "--pause", "-1"]) == 2  # usage
    assert main(["audit", "--dsn", dsn, "--pause", "soon"]) == 2


def test_cli_duty_option(planted: tuple[str, dict[str, frozenset[str]]]) -> None:
    dsn, _ = planted
    assert main(["audit", "--dsn", dsn, "--duty", "0.25"]) == 1  # damage planted
    assert main(["audit", "--dsn", dsn, "--duty", "1"]) == 1
    for bad in ("0", "1.5", "half"):
        assert main(["audit", "--dsn", dsn, "--duty", bad]) == 2


def _record_overlap(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """Wraps the scanner: one (step, thread name, other step in progress) per fetch and
    analysis of a range."""
    events: list[tuple[str, str, bool]] = []
    busy = {"fetch": 0, "analyse": 0}
    lock = threading.Lock()

    def wrap(step: str, other: str) -> None:
        original = getattr(audit_module._Scanner, step)

        def wrapped(self: object, *args: object) -> object:
            with lock:
                busy[step] += 1
                events.append((step, threading.current_thread().name, busy[other] > 0))
            try:
                return original(self, *args)
            finally:
                with lock:
                    busy[step] -= 1
                    if busy[other]:  # the other step started meanwhile
                        events.append((step, threading.current_thread().name, True))

        monkeypatch.setattr(audit_module._Scanner, step, wrapped)

    wrap("fetch", "analyse")
    wrap("analyse", "fetch")
    return events


def _fake_wal(monkeypatch: pytest.MonkeyPatch, *, live: bool) -> None:
    """The WAL as live workers would move it (far past the busy threshold), or still."""
    position = [0]

    def wal(_conn: object) -> int:
        position[0] += 10**9 if live else 0
        return position[0]

    monkeypatch.setattr(audit_module, "_wal_position", wal)


def test_beside_live_workers_the_audit_takes_one_core_at_a_time(
    planted: tuple[str, dict[str, frozenset[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, expected = planted
    monkeypatch.setattr(audit_module, "_clock", lambda: 0.0)  # no waits: a fast test
    _fake_wal(monkeypatch, live=True)
    events = _record_overlap(monkeypatch)
    report = audit(dsn, batch_rows=100)
    assert _found(report) == {t: set(e) for t, e in expected.items() if e}
    analyses = [e for e in events if e[0] == "analyse"]
    assert len(analyses) >= 3  # several ranges
    # each range's analysis ran in the audit's own thread, never beside a statement
    assert all(name == threading.current_thread().name for _, name, _ in analyses)
    assert not any(overlapped for _, _, overlapped in events)


@pytest.mark.parametrize("pace", ["quiet", "pause 0"])
def test_alone_the_analysis_overlaps_the_next_statement(
    pace: str, planted: tuple[str, dict[str, frozenset[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, expected = planted
    _fake_wal(monkeypatch, live=False)
    events = _record_overlap(monkeypatch)
    report = audit(dsn, batch_rows=100, pause=0.0 if pace == "pause 0" else None)
    assert _found(report) == {t: set(e) for t, e in expected.items() if e}
    analyses = [name for step, name, _ in events if step == "analyse"]
    # the first range is analysed in the audit's thread (before the pace knows the
    # database is quiet); after it, in the decode thread, while Postgres scans the next
    assert len(analyses) >= 3
    assert all(n.startswith("lgd-audit-decode") for n in analyses[1:])
