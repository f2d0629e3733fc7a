"""The audit's pace: a fixed --pause, or (the default) automatic: full speed while the
database is quiet, a wait as long as each range took while live workers write (WAL grows).
The effect on live workers' latency is measured by benchmarks/bench_audit.py, not here."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from benchmarks import fault_db

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops.audit import AUTO_BUSY_WAL_BYTES_PER_S, Pacer, audit


def test_fixed_pause_is_kept_whatever_the_load() -> None:
    pacer = Pacer(0.3)
    assert [pacer.wait_after(2.0, w, 1.0) for w in (0, 10**9, None)] == [0.3, 0.3, 0.3]
    assert Pacer(0.0).wait_after(2.0, 10**9, 1.0) == 0.0  # --pause 0: full speed
    with pytest.raises(ValueError):
        Pacer(-1.0)


def test_automatic_pace_runs_full_speed_when_quiet_and_halves_the_duty_when_busy() -> None:
    pacer = Pacer()
    busy = int(AUTO_BUSY_WAL_BYTES_PER_S * 2)  # in the 2 s interval below: just busy
    assert pacer.wait_after(0.4, 0, 2.0) == 0.0
    assert pacer.wait_after(0.4, busy - 1, 2.0) == 0.0
    assert pacer.wait_after(0.4, busy, 2.0) == pytest.approx(0.4)  # as long as the range
    assert pacer.wait_after(0.1, None, 2.0) == pytest.approx(0.1)  # WAL unreadable: careful
    assert pacer.busy_ranges == 2 and pacer.waited == pytest.approx(0.5)
    assert Pacer(duty=0.25).wait_after(0.1, busy, 2.0) == pytest.approx(0.3)


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
