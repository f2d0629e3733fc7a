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
import json
import math
import os
import queue
import resource
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


def refresh_active(dsn: str, threads: int, planted: int) -> None:
    """The 'active' controls were written "a moment ago": make that true again before each
    audit (an audit more than --idle after it would rightly call them stuck)."""
    active = [t for t, k in fault_db.plan(threads, planted) if k == "active"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
            "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')))"
            " WHERE thread_id = ANY(%s)",
            (active,),
        )


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


def _audit_child(
    dsn: str, pause: float | None, duty: float | None, src: str | None, priority: str | None,
    ready: Any, out: Any, stopped: Any,
) -> None:
    if src is not None:  # --compare: the audit of another checkout (its src/ directory)
        for name in [m for m in sys.modules if m.split(".")[0] == "langgraph_deterministic"]:
            del sys.modules[name]
        sys.path.insert(0, src)
    from langgraph_deterministic.ops import audit as audit_module

    # the automatic pace times each range: leave out the time this process sat in SIGSTOP
    audit_module._clock = lambda: time.monotonic() - stopped.value
    ready.set()  # imports done (spawn): the windows start now
    options: dict[str, Any] = {} if duty is None else {"duty": duty}
    if priority is not None:  # else the audit's default (an older checkout has no such option)
        options["priority"] = priority
    report = audit_module.audit(dsn, pause=pause, **options)
    report.heads.clear()  # not needed by the parent; keeps the pickle small
    out.put((report, resource.getrusage(resource.RUSAGE_SELF)))


def _idle_child(dsn: str, seconds: float, ready: Any, out: Any) -> None:
    """The null round: a process that is stopped and resumed like the audit but does
    nothing, so the on/off split itself can be seen to move the p99 by noise only."""
    ready.set()
    time.sleep(seconds)
    out.put((None, resource.getrusage(resource.RUSAGE_SELF)))


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] * 1000 if len(values) > 10 else float("nan")


class ServerCpu:
    """CPU seconds used by the server processes serving the ops tools (application_name
    'langgraph-deterministic ops'), read from /proc by a thread every 0.1 s: only when the
    server runs on this machine under this user (else :meth:`read` returns None). A
    backend's last 0.1 s before it disconnects can be missed."""

    def __init__(self, dsn: str) -> None:
        import threading

        self._conn = psycopg.connect(dsn, autocommit=True)
        self._tick = os.sysconf("SC_CLK_TCK")
        self._seen: dict[int, float] = {}
        self._readable = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for (pid,) in self._conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'langgraph-deterministic ops'"
            ).fetchall():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except PermissionError:  # a server run by another user
                    self._readable = False
                    continue
                except OSError:  # it exited meanwhile
                    continue
                self._seen[pid] = (int(fields[11]) + int(fields[12])) / self._tick

    def read(self) -> float | None:
        time.sleep(0.25)  # one more sample
        return sum(self._seen.values()) if self._readable else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def _temp_bytes(conn: Any) -> int:
    row = conn.execute("SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0])


Arm = tuple[str, float | None, str | None, str | None]  # name, duty, src, priority


def _round(args: argparse.Namespace, dsn: str, ctx: Any, arm: Arm | None, cpu: Any) -> tuple[list[tuple[str, float, float]], Any, float | None]:
    """One audit (or, ``arm`` None, an idle process) stopped and resumed every --window
    seconds: returns the windows, the audit's report and rusage, its backend CPU."""
    result = ctx.Queue()
    ready = ctx.Event()
    stopped = ctx.Value("d", 0.0)  # seconds the audit child spent stopped so far
    if arm is None:
        proc = ctx.Process(target=_idle_child, args=(dsn, args.null_seconds, ready, result))
    else:
        _, duty, src, priority = arm
        proc = ctx.Process(target=_audit_child, args=(dsn, args.pause, duty, src, priority, ready, result, stopped))
    before = cpu() if cpu else None
    windows: list[tuple[str, float, float]] = []
    proc.start()
    ready.wait()
    running = True
    while True:
        start = time.time()
        try:  # the report comes back before the child can exit (a Queue's rule)
            got = result.get(timeout=args.window)
        except queue.Empty:
            windows.append(("on" if running else "off", start, time.time()))
            if not running:
                stopped.value += time.time() - start  # before it can read its clock
            os.kill(proc.pid, signal.SIGSTOP if running else signal.SIGCONT)
            running = not running
            continue
        windows.append(("on" if running else "off", start, time.time()))
        break
    if not running:  # the report was on its way when the child was stopped: let it exit
        os.kill(proc.pid, signal.SIGCONT)
    proc.join()
    after = cpu() if cpu else None
    server_cpu = None if before is None or after is None else after - before
    return windows, got, server_cpu


def _split(windows: list[tuple[str, float, float]], samples: list[tuple[float, float]]) -> dict[str, list[list[float]]]:
    """Per phase, the writers' put latencies of each window."""
    by_phase: dict[str, list[list[float]]] = {"on": [], "off": []}
    for name, start, end in windows:
        if name == "off":
            start += 0.5  # a statement sent before SIGSTOP may still be running
        by_phase[name].append([took for at, took in samples if start <= at < end])
    return by_phase


def _ratio(on: list[list[float]], off: list[list[float]]) -> float:
    return pct([x for w in on for x in w], 0.99) / pct([x for w in off for x in w], 0.99)


def _interval(on: list[list[float]], off: list[list[float]], n: int = 300) -> tuple[float, float]:
    """A 90% bootstrap interval of the p99 ratio, resampling whole windows (latencies
    within a window are correlated: one noisy neighbour burst spans many puts)."""
    import random

    rng = random.Random(1)
    ratios = sorted(
        _ratio([rng.choice(on) for _ in on], [rng.choice(off) for _ in off]) for _ in range(n)
    )
    return ratios[int(0.05 * n)], ratios[int(0.95 * n) - 1]


def _by_round(rounds: list[tuple[list[list[float]], list[list[float]]]]) -> float:
    """The geometric mean of the rounds' own p99 ratios: each round compares windows that
    shared its load, and a quiet round counts as much as a loaded one (pooled, the
    loaded rounds' long tails hide what the audit does on a quiet machine)."""
    logs = [math.log(_ratio(on, off)) for on, off in rounds]
    return math.exp(sum(logs) / len(logs))


def _by_round_interval(rounds: list[tuple[list[list[float]], list[list[float]]]], n: int = 300) -> tuple[float, float]:
    """A 90% bootstrap interval of :func:`_by_round`, resampling whole windows within each round."""
    import random

    rng = random.Random(2)
    ratios = sorted(
        _by_round([([rng.choice(on) for _ in on], [rng.choice(off) for _ in off]) for on, off in rounds])
        for _ in range(n)
    )
    return ratios[int(0.05 * n)], ratios[int(0.95 * n) - 1]


def _set_autogroup_nice(pids: list[int], nice: int) -> None:
    """Give the sessions of ``pids`` (this bench's, the embedded server's) the scheduler
    weight of ``nice`` (Linux autogroups: each session shares the CPU as one). On a machine
    shared with other work this approximates a quiet one; the audit and the writers get
    the same (their clients are in this session, their backends in the server's)."""
    for pid in pids:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=50_000)
    parser.add_argument("--planted", type=int, default=200)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--interval", type=float, default=20.0, help="ms between a writer's puts")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per on/off window")
    parser.add_argument("--rounds", type=int, default=4, help="audits beside the writers")
    parser.add_argument("--null-seconds", type=float, default=40.0, help="length of the null round (0: none)")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--pause", type=float, default=None, help="audit: seconds between ranges (default: automatic)")
    parser.add_argument("--duty", type=float, default=None, help="audit: the automatic pace's duty cycle (default: audit's)")
    parser.add_argument("--priority", choices=["idle", "normal"], default=None,
                        help="audit: CPU priority of the audit alone and of the main arm (default: "
                        "audit's, idle; on a machine busy with other work an idle audit may not run at all)")
    parser.add_argument("--also-duty", type=float, action="append", default=[],
                        help="another arm: this checkout's audit at this duty (repeatable)")
    parser.add_argument("--also-priority", choices=("idle", "normal"), action="append", default=[],
                        help="another arm: this checkout's audit at this CPU priority (repeatable)")
    parser.add_argument("--compare", type=Path, help="another arm: the audit of another checkout's src/ directory")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--autogroup-nice", type=int, default=None,
                        help="Linux: run this bench's and the embedded server's sessions at this "
                             "autogroup nice (e.g. -10 as root on a machine shared with other work)")
    args = parser.parse_args()

    server = None
    url = os.environ.get("DATABASE_URL")
    if not url:
        cache = Path(os.environ.get("LGD_CACHE_DIR") or ROOT / ".cache")
        server = start_postgres(cache / "bench-audit-pg")
        url = server.dsn
    try:
        dsn, expected = database(url, args.threads, args.planted)
        if args.autogroup_nice is not None:
            if server is None:
                parser.error("--autogroup-nice needs the embedded server (no DATABASE_URL)")
            with psycopg.connect(dsn, autocommit=True) as conn:
                (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
            postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
            _set_autogroup_nice([os.getpid(), postmaster], args.autogroup_nice)
            print(f"autogroup nice {args.autogroup_nice} for this bench and the server (pid {postmaster})")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id LIKE 'writer-%%'")  # last run's
            conn.execute("VACUUM checkpoints, checkpoint_blobs, checkpoint_writes")  # not during the audit
            (n,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()  # type: ignore[misc]
            print(f"{n} checkpoints, {len(expected)} threads, {sum(1 for e in expected.values() if e)} with planted faults")

            pacing = "automatic" if args.pause is None else f"--pause {args.pause}"
            if args.duty is not None:
                pacing += f", duty {args.duty}"
            print(f"audit pacing: {pacing}; load average {_load()}")
            sampler = ServerCpu(dsn)
            cpu = sampler.read
            refresh_active(dsn, args.threads, args.planted)
            temp0 = _temp_bytes(conn)
            rusage0 = resource.getrusage(resource.RUSAGE_SELF)
            cpu0 = cpu()
            alone: dict[str, Any] = {} if args.duty is None else {"duty": args.duty}
            if args.priority is not None:
                alone["priority"] = args.priority
            report = audit(dsn, pause=args.pause, **alone)
            cpu1 = cpu()
            rusage1 = resource.getrusage(resource.RUSAGE_SELF)
            temp = _temp_bytes(conn) - temp0
        total, missed, false = check(report, expected)
        client_cpu = rusage1.ru_utime + rusage1.ru_stime - rusage0.ru_utime - rusage0.ru_stime
        server_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        print(
            f"audit alone: {report.seconds:.1f} s ({report.paused_seconds:.1f} s paused) for {report.checkpoints} checkpoints "
            f"({report.threads} threads); planted faults {total}, missed {missed}, "
            f"false positives {false}; counts {report.counts()}; priority {getattr(report, 'priority', 'normal')}, "
            f"backend {getattr(report, 'backend_priority', 'normal')}"
        )
        server_s = "n/a" if server_cpu is None else f"{server_cpu:.1f}"
        print(f"  CPU: server backend {server_s} s, audit process {client_cpu:.1f} s; temp files written {temp} bytes; load average {_load()}")
        figures: dict[str, Any] = {
            "alone": {"seconds": report.seconds, "paused": report.paused_seconds, "server_cpu": server_cpu,
                      "client_cpu": client_cpu, "temp_bytes": temp, "missed": missed, "false": false},
            "rounds": [],
        }

        # Interleaved: each audit runs in its own process, stopped (SIGSTOP) and resumed
        # every --window seconds, so "audit on" and "audit off" windows alternate through
        # the whole run and see the same background load (this machine is shared). The
        # writers run through every round; the first round is a null round (an idle
        # process in place of the audit): its ratio is the noise of the split itself.
        writers = Writers(dsn, args.writers, args.interval / 1000)
        writers.start()
        time.sleep(5)  # processes start, connect, warm up
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        main_arm: Arm = ("this checkout" + ("" if args.duty is None else f", duty {args.duty:g}")
                         + ("" if args.priority is None else f", priority {args.priority}"),
                         args.duty, None, args.priority)  # fmt: skip
        arms: list[Arm] = [main_arm] + [(f"this checkout, duty {d:g}", d, None, args.priority)
                                        for d in args.also_duty]  # fmt: skip
        arms += [(f"this checkout, priority {p}", args.duty, None, p) for p in args.also_priority]
        if args.compare:
            arms.append((f"{args.compare}", None, str(args.compare), None))
        # the arms take turns, round after round: each sees the same drift in load; a null
        # round (an idle process stopped and resumed the same way) takes its turn too, so
        # the noise floor is measured under the same drift, with the same statistics
        turn: list[Arm | None] = [None] if args.null_seconds > 0 else []
        plan = [arm for _ in range(args.rounds) for arm in turn + arms]
        rounds = []
        for arm in plan:
            refresh_active(dsn, args.threads, args.planted)
            load_before = _load()
            windows, (during, usage), server_cpu = _round(args, dsn, ctx, arm, cpu)
            rounds.append((arm, windows, during, usage, server_cpu, load_before, _load()))
        samples = writers.stop()
        sampler.close()

        null_name = "null round (idle process)"
        names = ([null_name] if args.null_seconds > 0 else []) + [arm[0] for arm in arms]
        pooled: dict[str, dict[str, list[list[float]]]] = {name: {"on": [], "off": []} for name in names}
        per_round: dict[str, list[tuple[list[list[float]], list[list[float]]]]] = {name: [] for name in names}
        bad = 0
        print(f"beside {args.writers} writers (one put every {args.interval:g} ms each), windows of {args.window:g} s:")
        for arm, windows, during, usage, server_cpu, load_before, load_after in rounds:
            phases = _split(windows, samples)
            on_s = sum(e - s for n, s, e in windows if n == "on")
            ratio = _ratio(phases["on"], phases["off"])
            p99 = {k: pct([x for w in v for x in w], 0.99) for k, v in phases.items()}
            name = null_name if arm is None else arm[0]
            pooled[name]["on"] += phases["on"]
            pooled[name]["off"] += phases["off"]
            per_round[name].append((phases["on"], phases["off"]))
            if arm is None:
                label = null_name
                detail = ""
                figures.setdefault("null_ratios", []).append(ratio)
            else:
                _, missed2, false2 = check(during, expected)
                if arm is main_arm:
                    bad += missed2 + false2
                server_s = "n/a" if server_cpu is None else f"{server_cpu:.1f} s"
                detail = (f"; audit {on_s:.1f} s running ({during.paused_seconds:.1f} s paused), "
                          f"CPU server {server_s} client {usage.ru_utime + usage.ru_stime:.1f} s, "
                          f"missed {missed2}, false positives {false2}")
                label = f"audit ({arm[0]})"
                figures["rounds"].append({"arm": arm[0], "ratio": ratio, "p99_off": p99["off"], "p99_on": p99["on"],
                                          "running": on_s, "paused": during.paused_seconds,
                                          "server_cpu": server_cpu, "client_cpu": usage.ru_utime + usage.ru_stime,
                                          "missed": missed2, "false": false2, "load": [load_before, load_after]})
            print(f"  {label}: p99 off {p99['off']:.2f} ms / on {p99['on']:.2f} ms = {ratio:.2f}"
                  f"{detail}; load average {load_before} -> {load_after}")
        figures["arms"] = {}
        for name, phases in pooled.items():
            on_v = [x for w in phases["on"] for x in w]
            off_v = [x for w in phases["off"] for x in w]
            r = _ratio(phases["on"], phases["off"])
            low, high = _interval(phases["on"], phases["off"])
            g = _by_round(per_round[name])
            g_low, g_high = _by_round_interval(per_round[name])
            figures["arms"][name] = {"ratio": r, "interval": [low, high], "p99_off": pct(off_v, 0.99),
                                     "p99_on": pct(on_v, 0.99), "puts": [len(off_v), len(on_v)],
                                     "by_round": g, "by_round_interval": [g_low, g_high],
                                     "round_ratios": [_ratio(on, off) for on, off in per_round[name]]}
            print(f"{name}: {args.rounds} rounds pooled, writers' p99 off {pct(off_v, 0.99):.2f} ms "
                  f"({len(off_v)} puts, p50 {pct(off_v, 0.5):.2f}) / on {pct(on_v, 0.99):.2f} ms ({len(on_v)} puts, "
                  f"p50 {pct(on_v, 0.5):.2f}) = {r:.2f} (90% interval over windows {low:.2f}-{high:.2f}); "
                  f"geometric mean of the rounds' ratios {g:.2f} ({g_low:.2f}-{g_high:.2f})")
        main_fig = figures["arms"][main_arm[0]]
        ok = missed == false == bad == 0 and report.seconds < 60
        # both: pooled (every put counts) and by round (every round's load counts)
        met = ok and main_fig["ratio"] < 1.2 and main_fig["by_round"] < 1.2
        print("RESULT:", "ok" if met else "NOT MET")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        if args.drop:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]}" WITH (FORCE)')
        return 0 if ok else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
