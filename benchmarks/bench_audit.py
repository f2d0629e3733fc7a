"""`langgraph-deterministic audit` on a big PostgresSaver-layout database, beside live writers.

    python benchmarks/bench_audit.py                      # 2M checkpoints, embedded Postgres
    DATABASE_URL=postgresql://... python benchmarks/bench_audit.py --threads 50000

Builds (once; later runs reuse it) a database of ``--threads`` threads of 40 checkpoints
with ``--planted`` threads of every fault class and of every negative control
(benchmarks/fault_db.py), then:

1. runs the audit alone: wall time, and every planted fault found / no false positive;
2. runs 8 writer processes (PostgresSaver.put on their own threads and connections,
   LangGraph's connection settings, one put every ``--interval`` ms each) while the audit
   runs in another process that is stopped and resumed every ``--window`` seconds, and
   prints the writers' put latency p50/p99 in the windows with and without the audit,
   and the ratio of the p99s.

The embedded server's data lives in $LGD_CACHE_DIR/bench-audit-pg, else
.cache/bench-audit-pg (about 4 GB; reused; delete it to rebuild).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from benchmarks import fault_db  # noqa: E402

from devtools.postgres import start_postgres  # noqa: E402
from langgraph_deterministic.ops.audit import audit  # noqa: E402

RUNS_PER_THREAD = 8  # 5 checkpoints a run: 40 a thread


def database(server_dsn: str, threads: int, planted: int) -> tuple[str, dict[str, frozenset[str]]]:
    name = f"lgd_bench_audit_{threads}_{planted}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    dsn = psycopg.conninfo.make_conninfo(server_dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ready = conn.execute("SELECT to_regclass('bench_expected') IS NOT NULL").fetchone()
        if ready and ready[0]:
            rows = conn.execute("SELECT thread_id, faults FROM bench_expected").fetchall()
            print(f"reusing database {name}")
            # the 'active' controls were written "a moment ago" when the database was built
            active = [t for t, k in fault_db.plan(threads, planted) if k == "active"]
            conn.execute(
                "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
                "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')))"
                " WHERE thread_id = ANY(%s)",
                (active,),
            )
            return dsn, {t: frozenset(f) for t, f in rows}
    started = time.perf_counter()
    expected = fault_db.build(dsn, threads=threads, planted=planted, runs=RUNS_PER_THREAD)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_expected (thread_id text PRIMARY KEY, faults text[])")
        with conn.cursor() as cur, cur.copy("COPY bench_expected FROM STDIN") as cp:
            for t, f in expected.items():
                cp.write_row((t, sorted(f)))
    print(f"built database {name} in {time.perf_counter() - started:.0f} s")
    return dsn, expected


def check(report: Any, expected: dict[str, frozenset[str]]) -> tuple[int, int, int]:
    found: dict[str, set[str]] = {}
    for f in report.findings:
        found.setdefault(f.thread_id, set()).add(f.fault)
    planted = {t: e for t, e in expected.items() if e}
    missed = sum(1 for t, e in planted.items() for fault in e if fault not in found.get(t, ()))
    false = sum(1 for t, got in found.items() for fault in got if fault not in expected.get(t, ()))
    return sum(len(e) for e in planted.values()), missed, false


def _writer(dsn: str, i: int, interval: float, stop: Any, out: Any) -> None:
    """One live worker (its own process, as workers are): a put every ``interval`` s;
    sends back (start time, seconds) of every put."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver

    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)
    messages = [HumanMessage("x" * 400), AIMessage("y" * 1200)]
    thread = f"writer-{i}-{time.time_ns()}"
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    samples: list[tuple[float, float]] = []
    step = 0
    next_at = time.perf_counter()
    while not stop.is_set():
        step += 1
        version = saver.get_next_version(checkpoint["channel_versions"].get("messages"), None)
        checkpoint = create_checkpoint(checkpoint, None, step)
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"]["messages"] = version
        metadata: Any = {"source": "loop", "step": step, "run_id": f"{thread}:run"}
        t0 = time.time()
        c0 = time.perf_counter()
        config = saver.put(config, checkpoint, metadata, {"messages": version})
        samples.append((t0, time.perf_counter() - c0))
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.perf_counter()
    conn.close()
    out.put(samples)


class Writers:
    """``n`` writer processes; :meth:`stop` returns every (start time, seconds) sample."""

    def __init__(self, dsn: str, n: int, interval: float) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._out = ctx.Queue()
        self._procs = [
            ctx.Process(target=_writer, args=(dsn, i, interval, self._stop, self._out))
            for i in range(n)
        ]

    def start(self) -> None:
        for p in self._procs:
            p.start()

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        samples = [s for _ in self._procs for s in self._out.get()]
        for p in self._procs:
            p.join()
        return samples


def _audit_child(dsn: str, pause: float | None, ready: Any, out: Any, stopped: Any) -> None:
    from langgraph_deterministic.ops import audit as audit_module

    # the automatic pace times each range: leave out the time this process sat in SIGSTOP
    audit_module._clock = lambda: time.monotonic() - stopped.value
    ready.set()  # imports done (spawn): the windows start now
    report = audit(dsn, pause=pause)
    report.heads.clear()  # not needed by the parent; keeps the pickle small
    out.put(report)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] * 1000 if len(values) > 10 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=50_000)
    parser.add_argument("--planted", type=int, default=200)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--interval", type=float, default=20.0, help="ms between a writer's puts")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per on/off window")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--pause", type=float, default=None, help="audit: seconds between ranges (default: automatic)")
    args = parser.parse_args()

    server = None
    url = os.environ.get("DATABASE_URL")
    if not url:
        cache = Path(os.environ.get("LGD_CACHE_DIR") or ROOT / ".cache")
        server = start_postgres(cache / "bench-audit-pg")
        url = server.dsn
    try:
        dsn, expected = database(url, args.threads, args.planted)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id LIKE 'writer-%%'")  # last run's
            (n,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()  # type: ignore[misc]
        print(f"{n} checkpoints, {len(expected)} threads, {sum(1 for e in expected.values() if e)} with planted faults")

        pacing = "automatic" if args.pause is None else f"--pause {args.pause}"
        print(f"audit pacing: {pacing}")
        report = audit(dsn, pause=args.pause)
        total, missed, false = check(report, expected)
        print(
            f"audit alone: {report.seconds:.1f} s ({report.paused_seconds:.1f} s paused) for {report.checkpoints} checkpoints "
            f"({report.threads} threads); planted faults {total}, missed {missed}, "
            f"false positives {false}; counts {report.counts()}"
        )

        # Interleaved: the audit runs in its own process, stopped (SIGSTOP) and resumed
        # every --window seconds, so "audit on" and "audit off" windows alternate through
        # the whole run and see the same background load (this machine is shared).
        writers = Writers(dsn, args.writers, args.interval / 1000)
        writers.start()
        time.sleep(5)  # processes start, connect, warm up
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        result = ctx.Queue()
        ready = ctx.Event()
        stopped = ctx.Value("d", 0.0)  # seconds the audit child spent stopped so far
        proc = ctx.Process(target=_audit_child, args=(dsn, args.pause, ready, result, stopped))
        windows: list[tuple[str, float, float]] = []
        proc.start()
        ready.wait()
        running = True
        while True:
            start = time.time()
            try:  # the report comes back before the child can exit (a Queue's rule)
                during = result.get(timeout=args.window)
            except queue.Empty:
                windows.append(("on" if running else "off", start, time.time()))
                if not running:
                    stopped.value += time.time() - start  # before it can read its clock
                os.kill(proc.pid, signal.SIGSTOP if running else signal.SIGCONT)
                running = not running
                continue
            windows.append(("on", start, time.time()))
            break
        proc.join()
        samples = writers.stop()
        by_phase: dict[str, list[float]] = {"on": [], "off": []}
        for name, start, end in windows:
            if name == "off":
                start += 0.5  # a statement sent before SIGSTOP may still be running
            by_phase[name] += [took for at, took in samples if start <= at < end]
        _, missed2, false2 = check(during, expected)
        on_s = sum(e - s for n, s, e in windows if n == "on")
        print(
            f"audit beside {args.writers} writers: {on_s:.1f} s running ({len(windows)} windows "
            f"of {args.window} s, alternately running and stopped; {during.paused_seconds:.1f} s "
            f"paused, {during.seconds:.1f} s wall); missed {missed2}, false positives {false2}"
        )
        base = by_phase["off"]
        for name in ("off", "on"):
            v = by_phase[name]
            print(f"  writers, audit {name:3}: {len(v):6} puts  p50 {pct(v, 0.5):6.2f} ms  p99 {pct(v, 0.99):6.2f} ms")
        ratio = pct(by_phase["on"], 0.99) / pct(base, 0.99)
        print(f"writers' p99 during the audit / baseline p99: {ratio:.2f}")
        ok = missed == false == missed2 == false2 == 0 and report.seconds < 60
        print("RESULT:", "ok" if ok and ratio < 1.2 else "NOT MET")
        if args.drop:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]}" WITH (FORCE)')
        return 0 if ok else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
