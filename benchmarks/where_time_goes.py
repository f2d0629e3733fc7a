"""Where a graph run's time goes, on DeterministicSaver and on langgraph's PostgresSaver.

One sync graph run at a time (bench_saver.py's graph), each saver on one connection to
its own database. Printed per run:

1. totals: wall, client CPU, server backend CPU (``/proc/PID/schedstat``), and the same
   graph on InMemorySaver (the engine's own cost: what no checkpointer can remove);
2. server: per statement, calls and executor time from ``pg_stat_statements``, and the
   plpgsql functions' self time from ``pg_stat_user_functions``; executor time vs the
   backend's CPU shows what parse/bind/protocol/commit cost on top;
3. client: CPU inside the saver's methods and its serialiser (thread CPU time of
   wrapped methods), with calls per run (is anything serialised twice?);
5. candidate changes tried on whole graph runs without touching the library (blob
   compression lz4 / none, and policy "off" = the retry contract's whole cost);
4. TOAST: server CPU per 10 KB ``put`` with ``checkpoint_blobs.blob`` compressed by
   pglz, by lz4 (when the server has it), or stored uncompressed (``STORAGE EXTERNAL``),
   alternating, plus the stored size; and the server's cost of parsing a typical
   checkpoint as jsonb vs json.

``pg_stat_statements`` must be preloaded, so by default this starts its own Postgres from
the machine's binaries (the ``system`` backend of langgraph_deterministic.embedded) with
``shared_preload_libraries=pg_stat_statements`` and ``track_functions=all``; with
``--database-url`` it uses that server and skips what it lacks.

Run: ``python benchmarks/where_time_goes.py [--runs 20] [--reps 3]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    import bench_saver as b
    from harness import process_cpu_s
else:
    from . import bench_saver as b
    from .harness import process_cpu_s

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver

from devtools.postgres import (
    EmbeddedPostgres,
    create_database,
    database_name,
    drop_database,
    start_postgres,
)
from langgraph_deterministic import DeterministicSaver


def start_server() -> tuple[EmbeddedPostgres, Path]:
    """System-binaries Postgres with pg_stat_statements preloaded (needs a restart)."""
    root = Path(tempfile.mkdtemp(prefix="lgd-wtg-"))
    root.chmod(0o755)  # the server runs as another OS user when we are root
    data = root / "data"
    server = start_postgres(data, backend="system")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        conn.execute("ALTER SYSTEM SET track_functions = 'all'")
    server.stop()
    server = start_postgres(data, backend="system")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        # Also the statements run inside the plpgsql guards (toplevel = false).
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    return server, root


def same_compression(conn: psycopg.Connection[Any]) -> None:
    """The peer's columns compressed as ours' migrations 0018/0022 compress them (lz4 where
    the server has it), as in bench_graph.py, where both savers share one database: else
    the peer's blobs alone pay pglz (about twice lz4's server CPU per 10 KB put, section
    4), and the comparison says more about compression than about the savers."""
    row = conn.execute(
        "SELECT current_setting('server_version_num')::int >= 140000 AND EXISTS (SELECT 1"
        " FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))"
        " AS lz4"
    ).fetchone()  # the peer's connection has row_factory=dict_row
    if row and (row["lz4"] if isinstance(row, dict) else row[0]):
        for table, column in (("checkpoint_blobs", "blob"), ("checkpoints", "checkpoint"),
                              ("checkpoint_writes", "blob")):  # fmt: skip
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


class Side:
    def __init__(self, name: str, dsn: str | None, label: str | None = None) -> None:
        self.name = name  # ours | peer | memory
        self.label = label or name
        self.conn: psycopg.Connection[Any] | None = None
        if name == "memory":
            self.graph = b.compile_graph("memory")
            self.pid = None
            return
        assert dsn is not None
        if name == "ours":
            self.conn = psycopg.connect(dsn, **b.OURS_POOL_KWARGS)
            if label is None:
                DeterministicSaver(self.conn).setup()
        else:
            self.conn = psycopg.connect(dsn, **b.PEER_POOL_KWARGS)
            if label is None:
                PostgresSaver(self.conn).setup()  # type: ignore[arg-type]
                same_compression(self.conn)
        if self.label.endswith("async-commit"):  # commits without waiting for the WAL flush
            self.conn.execute("SET synchronous_commit = off")
        self.graph = b.compile_graph(name, self.conn)
        self.pid = self.conn.info.backend_pid
        self.dsn, self.dbname = dsn, database_name(dsn)

    def runs(self, n: int) -> Callable[[], None]:
        configs = [b.graph_config(self.name) for _ in range(n)]
        if self.name == "memory":  # a fresh saver: it keeps every checkpoint
            self.graph = b.compile_graph("memory")

        def go() -> None:
            for config in configs:
                self.graph.invoke(b.graph_input(), config, durability="sync")

        return go

    def measure(self, n: int) -> tuple[float, float, float | None]:
        """(wall, client CPU, server CPU) ms per run."""
        run = self.runs(n)
        srv0 = process_cpu_s([self.pid]) if self.pid else None
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        t1, c1 = time.perf_counter(), time.process_time()
        srv1 = process_cpu_s([self.pid]) if self.pid else None
        srv = (srv1 - srv0) * 1e3 / n if srv0 is not None and srv1 is not None else None
        return (t1 - t0) * 1e3 / n, (c1 - c0) * 1e3 / n, srv


def totals(sides: Sequence[Side], runs: int, reps: int) -> None:
    samples: dict[str, list[tuple[float, float, float | None]]] = defaultdict(list)
    for s in sides:
        s.runs(2)()  # warm up
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for s in order:
            samples[s.label].append(s.measure(runs))
    print(f"\n## 1. per run, median of {reps} alternating reps x {runs} runs (ms)")
    print(f"{'side':<18} {'wall':>7} {'client CPU':>11} {'server CPU':>11} {'cli+srv':>8}")
    for s in sides:
        wall = statistics.median(x[0] for x in samples[s.label])
        cli = statistics.median(x[1] for x in samples[s.label])
        srvs = [x[2] for x in samples[s.label] if x[2] is not None]
        srv = statistics.median(srvs) if srvs else 0.0
        print(f"{s.label:<18} {wall:>7.1f} {cli:>11.1f} {srv:>11.1f} {cli + srv:>8.1f}")
    print(
        "(wall - CPU = waiting: mostly the WAL flush of each commit; the async-commit rows "
        "run the same with synchronous_commit=off to show it)"
    )


def server_statements(admin: str, sides: Sequence[Side], runs: int) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        have = conn.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
        ).fetchone()
        if have is None:
            print("\n## 2. server statements: skipped (pg_stat_statements not installed)")
            return
        print(f"\n## 2. server, per run ({runs} runs): pg_stat_statements / pg_stat_user_functions")
        for s in sides:
            if s.conn is None:
                continue
            conn.execute("SELECT pg_stat_statements_reset()")
            s.conn.execute("SELECT pg_stat_reset()")
            srv0 = process_cpu_s([s.pid]) if s.pid else None
            s.runs(runs)()
            srv1 = process_cpu_s([s.pid]) if s.pid else None
            time.sleep(0.6)  # function stats reach the view when the backend reports them
            rows = conn.execute(
                """SELECT calls, total_exec_time, toplevel, rows,
                          left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
                     FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                    WHERE d.datname = %s
                    ORDER BY toplevel DESC, total_exec_time DESC""",
                (s.dbname,),
            ).fetchall()
            exec_ms = sum(r[1] for r in rows if r[2]) / runs
            cpu = (srv1 - srv0) * 1e3 / runs if srv0 is not None and srv1 is not None else None
            print(f"\n{s.name}: {sum(r[0] for r in rows if r[2]) / runs:.0f} statements/run, "
                  f"executor {exec_ms:.2f} ms/run, backend CPU "
                  f"{f'{cpu:.2f}' if cpu is not None else 'n/a'} ms/run")  # fmt: skip
            print(f"  {'calls/run':>9} {'exec ms/run':>11} {'us/call':>8}  statement")
            for calls, total, top, _rows, query in rows[:14]:
                if total / runs < 0.005 or "pg_stat" in query:
                    continue
                print(f"  {calls / runs:>9.1f} {total / runs:>11.3f} "
                      f"{total * 1e3 / max(1, calls):>8.1f}  {'' if top else '  (nested) '}{query}")  # fmt: skip
            with psycopg.connect(s.dsn, autocommit=True) as dbconn:
                funcs = dbconn.execute(
                    """SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions
                        ORDER BY self_time DESC"""
                ).fetchall()
            for name, calls, total, self_t in funcs:
                print(f"  function {name}: {calls / runs:.1f} calls/run, self "
                      f"{self_t / runs:.3f} ms/run, total {total / runs:.3f} ms/run")  # fmt: skip


class CpuMeter:
    """Thread CPU time (``time.thread_time``: waiting for the server is not counted) and
    calls inside wrapped methods, per label; nested wrapped calls are not subtracted."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj: Any, method: str, label: str) -> None:
        fn = getattr(obj, method)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[label] += time.thread_time() - t0
                self.calls[label] += 1

        setattr(obj, method, wrapped)


def client_split(sides: Sequence[Side], runs: int, reps: int) -> None:
    """Client CPU inside the saver's methods, and inside its serialiser, per run."""
    print(f"\n## 3. client CPU per run inside saver methods (thread CPU; median of {reps} "
          f"alternating reps x {runs} runs; ms, calls/run)")  # fmt: skip
    results: dict[str, list[tuple[dict[str, float], dict[str, int], float]]] = defaultdict(list)
    for rep in range(reps):
        for s in sides if rep % 2 == 0 else list(reversed(sides)):
            saver = s.graph.checkpointer
            meter = CpuMeter()
            originals = dict(vars(saver))
            serde_orig = dict(vars(saver.serde))
            for m in ("put", "put_writes", "get_tuple", "get_next_version"):
                meter.wrap(saver, m, m)
            for m in ("dumps_typed", "loads_typed"):
                meter.wrap(saver.serde, m, m)
            run = s.runs(runs) if s.name != "memory" else None
            if run is None:  # memory: runs() rebuilt the graph; wrap its new saver
                run = s.runs(runs)
                saver = s.graph.checkpointer
                originals, serde_orig = dict(vars(saver)), dict(vars(saver.serde))
                for m in ("put", "put_writes", "get_tuple", "get_next_version"):
                    meter.wrap(saver, m, m)
                for m in ("dumps_typed", "loads_typed"):
                    meter.wrap(saver.serde, m, m)
            c0 = time.process_time()
            run()
            total = (time.process_time() - c0) * 1e3 / runs
            for obj, orig in ((saver, originals), (saver.serde, serde_orig)):
                for key in [k for k in vars(obj) if k not in orig]:
                    delattr(obj, key)
            results[s.name].append((dict(meter.cpu), dict(meter.calls), total))
    labels = ["put", "put_writes", "get_tuple", "get_next_version", "dumps_typed", "loads_typed"]
    print(f"  {'':<18}" + "".join(f"{s.name:>16}" for s in sides))
    for label in labels:
        cells = []
        for s in sides:
            ms = statistics.median(r[0].get(label, 0.0) * 1e3 / runs for r in results[s.name])
            calls = results[s.name][0][1].get(label, 0) / runs
            cells.append(f"{ms:>8.2f} ({calls:>4.1f})")
        print(f"  {label:<18}" + "".join(f"{c:>16}" for c in cells))
    print(f"  {'process CPU/run':<18}" + "".join(
        f"{statistics.median(r[2] for r in results[s.name]):>16.2f}" for s in sides))  # fmt: skip
    print("  (put/put_writes include their dumps_typed calls; get_tuple its loads_typed)")


def toast(dsn: str, puts: int, reps: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        saver = DeterministicSaver(conn, run_id_policy="off")
        pid = conn.info.backend_pid
        try:
            conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION lz4")
            variants = ["pglz", "lz4", "external"]
        except psycopg.Error as exc:
            print(f"\n(lz4 unavailable on this server: {str(exc).strip()[:80]})")
            variants = ["pglz", "external"]

        def apply(v: str) -> None:
            if v == "external":
                conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET STORAGE EXTERNAL")
            else:
                conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET STORAGE EXTENDED")
                conn.execute(f"ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION {v}")

        cpu: dict[str, list[float]] = defaultdict(list)
        size: dict[str, float] = {}
        for rep in range(reps + 1):
            for v in variants if rep % 2 == 0 else list(reversed(variants)):
                apply(v)
                thread = f"toast-{v}-{rep}"
                inputs = b._put_inputs(saver, puts)
                config = b.thread_config(thread)
                s0 = process_cpu_s([pid])
                for ckpt, meta, versions in inputs:
                    config = saver.put(config, ckpt, meta, versions)  # type: ignore[arg-type]
                s1 = process_cpu_s([pid])
                if rep and s0 is not None and s1 is not None:  # rep 0 warms up
                    cpu[v].append((s1 - s0) * 1e6 / puts)
                row = conn.execute(
                    "SELECT avg(pg_column_size(blob)), avg(octet_length(blob)) "
                    "FROM checkpoint_blobs WHERE thread_id = %s",
                    (thread,),
                ).fetchone()
                assert row is not None
                size[v] = float(row[0])
                raw = float(row[1])
        apply("pglz")
        print(f"\n## 4. TOAST of checkpoint_blobs.blob: server CPU per put of a {raw / 1024:.1f} "
              f"KB blob ({puts} puts x {reps} alternating reps, median)")  # fmt: skip
        for v in variants:
            print(f"  {v:<9} {statistics.median(cpu[v]):>7.1f} us/put  stored {size[v] / 1024:.1f} KB"
                  if cpu[v] else f"  {v:<9} n/a")  # fmt: skip
        text = conn.execute(
            "SELECT checkpoint::text FROM checkpoints ORDER BY length(checkpoint::text) DESC LIMIT 1"
        ).fetchone()
        assert text is not None
        out = {}
        n = 20000
        for kind in ("text", "json", "jsonb", "text", "json", "jsonb"):
            s0 = process_cpu_s([pid])
            conn.execute(
                f"SELECT count((%s || repeat(' ', g %% 2))::{kind}::text) "
                "FROM generate_series(1, %s) g",
                (text[0], n),
            )
            s1 = process_cpu_s([pid])
            if s0 is not None and s1 is not None:
                out[kind] = (s1 - s0) * 1e6 / n  # the second pass of each wins (warm)
        if out:
            print(f"  the largest checkpoint column is {len(text[0])} chars (values are in "
                  f"blobs): parsing it costs jsonb {out['jsonb'] - out['text']:.2f} us, json "
                  f"{out['json'] - out['text']:.2f} us over text")  # fmt: skip


def graph_ab(dsn: str, runs: int, reps: int) -> None:
    """Candidate optimisations tried on a scratch database, no library change: whole sync
    graph runs of ours (policy require) alternating between variants."""
    conn = psycopg.connect(dsn, **b.OURS_POOL_KWARGS)
    pid = conn.info.backend_pid
    graphs = {
        policy: b.build_graph(False).compile(
            checkpointer=DeterministicSaver(conn, run_id_policy=policy)  # type: ignore[arg-type]
        )
        for policy in ("require", "off")
    }
    try:
        conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION pglz")
        lz4 = True
        conn.execute("ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION lz4")
    except psycopg.Error:
        lz4 = False
    storage = "ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET STORAGE {}"
    compression = "ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION {}"
    variants: dict[str, tuple[str, list[str]]] = {
        "baseline (pglz)": ("require", [storage.format("EXTENDED"), compression.format("pglz")]),
        "blob lz4": ("require", [storage.format("EXTENDED"), compression.format("lz4")]),
        "blob uncompressed": ("require", [storage.format("EXTERNAL")]),
        "policy off (no guard)": ("off", [storage.format("EXTENDED"), compression.format("pglz")]),
    }
    if not lz4:
        del variants["blob lz4"]
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rep in range(reps + 1):
        names = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in names:
            policy, ddl = variants[name]
            for stmt in ddl:
                conn.execute(stmt)
            configs = [b.graph_config("ours") for _ in range(runs)]
            s0, c0 = process_cpu_s([pid]), time.process_time()
            for config in configs:
                graphs[policy].invoke(b.graph_input(), config, durability="sync")
            c1, s1 = time.process_time(), process_cpu_s([pid])
            if rep and s0 is not None and s1 is not None:  # rep 0 warms up
                samples[name].append(((c1 - c0) * 1e3 / runs, (s1 - s0) * 1e3 / runs))
    for stmt in variants["baseline (pglz)"][1]:
        conn.execute(stmt)
    conn.close()
    print(f"\n## 5. candidate changes on whole graph runs (ours, one connection; median of "
          f"{reps} alternating reps x {runs} runs; ms per run)")  # fmt: skip
    base = samples["baseline (pglz)"]
    b_cli = statistics.median(x[0] for x in base)
    b_srv = statistics.median(x[1] for x in base)
    print(f"  {'variant':<24} {'client':>7} {'server':>7} {'d client':>9} {'d server':>9}")
    for name in variants:
        cli = statistics.median(x[0] for x in samples[name])
        srv = statistics.median(x[1] for x in samples[name])
        print(f"  {name:<24} {cli:>7.2f} {srv:>7.2f} {cli - b_cli:>+9.2f} {srv - b_srv:>+9.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="graph runs per measurement")
    parser.add_argument("--reps", type=int, default=3, help="alternating reps (median)")
    parser.add_argument("--database-url", default=None, help="use this server")
    parser.add_argument("--only", default="totals,server,client,toast,ab")
    args = parser.parse_args(argv)
    parts = set(args.only.split(","))
    server: EmbeddedPostgres | None = None
    root: Path | None = None
    if args.database_url:
        admin = args.database_url
    else:
        server, root = start_server()
        admin = server.dsn
    dbs: list[str] = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            print("# " + str(conn.execute("SELECT version()").fetchone()[0]))  # type: ignore[index]
            settings = conn.execute(
                "SELECT string_agg(name || '=' || setting, ', ') FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'shared_preload_libraries', "
                "'default_toast_compression', 'wal_level')"
            ).fetchone()
            print(f"# {settings[0] if settings else ''}")
        dbs += [create_database(admin, "lgd_wtg_ours"), create_database(admin, "lgd_wtg_peer")]
        sides = [Side("ours", dbs[0]), Side("peer", dbs[1]), Side("memory", None)]
        if "totals" in parts:
            extra = [
                Side("ours", dbs[0], "ours async-commit"),
                Side("peer", dbs[1], "peer async-commit"),
            ]
            totals([*sides, *extra], args.runs, args.reps)
            for x in extra:
                assert x.conn is not None
                x.conn.close()
        if "server" in parts:
            server_statements(admin, sides, args.runs)
        if "client" in parts:
            client_split(sides, args.runs, args.reps)
        if "toast" in parts:
            toast(dbs[0], 100, args.reps)
        if "ab" in parts:
            graph_ab(dbs[0], args.runs, args.reps)
        for s in sides:
            if s.conn is not None:
                s.conn.close()
        return 0
    finally:
        for d in dbs:
            drop_database(admin, database_name(d))
        if server is not None:
            server.stop()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
