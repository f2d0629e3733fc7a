"""Where each saver's time goes, per operation, measured without wall-clock noise.

For DeterministicSaver (ours) and langgraph's PostgresSaver (peer), each on one
connection to its own fresh database on the same server, this prints per operation:

* ``rt``      network round trips (Sync messages + simple-protocol queries: each one
              makes the client wait for the server), from a libpq protocol trace;
* ``stmts``   statements executed (Execute messages + simple queries);
* ``parse``   statements parsed (unprepared or new) in that operation;
* ``KB out``  bytes sent to the server;
* ``cli ms``  client CPU time (process CPU, untraced pass);
* ``srv ms``  CPU time of the server backend serving the connection (from
              /proc/<pid>/stat; only when the server runs on this machine).

CPU times are per-operation averages over ``--ops`` repetitions, the median of ``--reps``
rounds that alternate the two sides. CPU time depends far less than wall time on how busy
the machine is (not entirely: caches and frequency still move it), so this shows what a
wall-clock ratio in bench_saver.py is made of. The
sync API is measured; the async one runs the same core and queries.

Run: ``python benchmarks/cost_breakdown.py [--ops N] [--only put,graph_sync]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
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
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import pq
from psycopg.rows import dict_row

from devtools.postgres import (
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
)
from langgraph_deterministic import DeterministicSaver

OPS = ["put", "put_writes", "get_tuple", "list100", "graph_sync"]


def backend_cpu_s(pid: int) -> float | None:
    """CPU seconds of a local process; None when not on this machine."""
    return process_cpu_s([pid])


def trace_counts(conn: psycopg.Connection[Any], fn: Callable[[], Any]) -> dict[str, float]:
    """Run ``fn`` once with a libpq trace on ``conn``; count protocol messages."""
    with tempfile.NamedTemporaryFile("w+", suffix=".trace") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            fn()
        finally:
            conn.pgconn.untrace()
        f.seek(0)
        lines = [line.split("\t") for line in f.read().splitlines() if line.count("\t") >= 2]
    msgs = Counter((p[0], p[2].split()[0]) for p in lines)
    sent = sum(int(p[1]) for p in lines if p[0] == "F")
    return {
        "rt": msgs["F", "Sync"] + msgs["F", "Query"],
        "stmts": msgs["F", "Execute"] + msgs["F", "Query"],
        "parse": msgs["F", "Parse"],
        "kb_out": sent / 1024,
    }


class Subject:
    def __init__(
        self,
        name: str,
        saver: BaseCheckpointSaver[Any],
        graph_saver: BaseCheckpointSaver[Any],
        conn: psycopg.Connection[Any],
    ):
        self.name, self.saver, self.conn = name, saver, conn
        self.pid = conn.info.backend_pid
        self.graph = b.build_graph(False).compile(checkpointer=graph_saver)
        self.thread = f"{name}-cost"
        self.put_config = b.thread_config(f"{name}-cost-put")
        self.writes_config: Any = None

    def prepare(self) -> None:
        b.fill_thread(self.saver, f"{self.name}-read", b.READ_THREAD_CHECKPOINTS)
        b.fill_thread(self.saver, f"{self.name}-list", b.LIST_THREAD_CHECKPOINTS)
        ((ckpt, meta, versions),) = b._put_inputs(self.saver, 1)
        self.writes_config = self.saver.put(
            b.thread_config(f"{self.name}-cost-pw"),
            ckpt,
            meta,  # type: ignore[arg-type]
            versions,
        )

    def op(self, name: str, n: int) -> Callable[[], None]:
        """A callable doing ``n`` operations ``name`` (inputs built beforehand)."""
        s = self.saver
        if name == "put":
            inputs = b._put_inputs(s, n)

            def put() -> None:
                for ckpt, meta, versions in inputs:
                    self.put_config = s.put(self.put_config, ckpt, meta, versions)  # type: ignore[arg-type]

            return put
        if name == "put_writes":
            writes = b._writes()
            base = time.perf_counter_ns()

            def put_writes() -> None:
                for i in range(n):
                    s.put_writes(self.writes_config, writes, f"t{base}-{i}", "~__pregel_pull, n2")

            return put_writes
        if name == "get_tuple":
            config = b.thread_config(f"{self.name}-read")

            def get_tuple() -> None:
                for _ in range(n):
                    assert s.get_tuple(config) is not None

            return get_tuple
        if name == "list100":
            config = b.thread_config(f"{self.name}-list")

            def list100() -> None:
                for _ in range(n):
                    assert len(list(s.list(config, limit=b.LIST_LIMIT))) == b.LIST_LIMIT

            return list100
        if name == "graph_sync":
            configs = [b.graph_config(self.name) for _ in range(n)]

            def graph() -> None:
                for config in configs:
                    self.graph.invoke(b.graph_input(), config, durability="sync")

            return graph
        raise ValueError(name)


def measure_cpu(subject: Subject, name: str, ops: int) -> tuple[float, float]:
    """(client CPU ms, server backend CPU ms or -1) per operation, over ``ops`` ops."""
    run = subject.op(name, ops)
    srv0, cli0 = backend_cpu_s(subject.pid), time.process_time()
    run()
    cli1, srv1 = time.process_time(), backend_cpu_s(subject.pid)
    srv = (srv1 - srv0) * 1e3 / ops if srv0 is not None and srv1 is not None else -1.0
    return (cli1 - cli0) * 1e3 / ops, srv


def measure(subjects: Sequence[Subject], name: str, ops: int, reps: int) -> list[dict[str, float]]:
    """Protocol counts from one traced operation per side, then CPU in ``reps`` rounds that
    alternate the sides (CPU time too drifts with the load on a shared machine); medians."""
    out = []
    for s in subjects:
        s.op(name, 6)()  # warm up: past psycopg's prepare threshold (5), caches
        out.append(trace_counts(s.conn, s.op(name, 1)))
    cpu: list[list[tuple[float, float]]] = [[] for _ in subjects]
    for rep in range(reps):
        order = list(range(len(subjects)))
        if rep % 2:
            order.reverse()
        for i in order:
            cpu[i].append(measure_cpu(subjects[i], name, ops))
    for counts, samples in zip(out, cpu, strict=True):
        counts["cli_ms"] = statistics.median(c for c, _ in samples)
        counts["srv_ms"] = statistics.median(s for _, s in samples)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=300, help="operations per measurement")
    parser.add_argument("--reps", type=int, default=5, help="alternating CPU rounds (median)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {OPS}")
    parser.add_argument("--policy", default="require", choices=["require", "warn", "off"],
                        help="our run_id_policy (graph runs pass run_config())")  # fmt: skip
    args = parser.parse_args(argv)
    selected = [o for o in OPS if not args.only or o in args.only.split(",")]
    url, server = ensure_database_url()
    dbs: list[str] = []
    try:
        dbs += [create_database(url, "lgd_cost_ours"), create_database(url, "lgd_cost_peer")]
        c_ours = psycopg.connect(dbs[0], autocommit=True)
        c_peer = psycopg.connect(dbs[1], autocommit=True, prepare_threshold=0, row_factory=dict_row)
        # As in bench_saver.py: direct saver calls carry no run id (policy "off"); graph
        # runs use run_config() and the policy under test.
        ours = DeterministicSaver(c_ours, run_id_policy="off")
        ours.setup()
        ours_graph = b.graph_saver("ours", c_ours, policy=args.policy)
        peer = PostgresSaver(c_peer)  # type: ignore[arg-type]
        peer.setup()
        subjects = [Subject("ours", ours, ours_graph, c_ours), Subject("peer", peer, peer, c_peer)]
        for s in subjects:
            s.prepare()
        head = f"{'operation':<11} {'side':<5} {'rt':>5} {'stmts':>6} {'parse':>6} {'KB out':>7} {'cli ms':>7} {'srv ms':>7}"
        print(head)
        print("-" * len(head))
        for name in selected:
            n = max(1, args.ops // 20) if name in ("graph_sync", "list100") else args.ops
            for s, m in zip(subjects, measure(subjects, name, n, args.reps), strict=True):
                srv = f"{m['srv_ms']:.3f}" if m["srv_ms"] >= 0 else "n/a"
                print(f"{name:<11} {s.name:<5} {m['rt']:>5.0f} {m['stmts']:>6.0f} {m['parse']:>6.0f} "
                      f"{m['kb_out']:>7.1f} {m['cli_ms']:>7.3f} {srv:>7}", flush=True)  # fmt: skip
        print(f"\n(per operation; graph_sync = one whole run; CPU: median of {args.reps} "
              f"alternating rounds of {args.ops} ops, {max(1, args.ops // 20)} for graph_sync "
              "and list100)")  # fmt: skip
        c_ours.close()
        c_peer.close()
        return 0
    finally:
        for dsn in dbs:
            drop_database(url, database_name(dsn))
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
