"""Small, dependency-free helpers for the benchmarks: timing samples, statistics,
interleaved rounds, the results table and optional cProfile dumps.

A *workload* is measured as one :class:`Sample` per (round, side): how many operations
ran, how long the whole batch took, and each operation's latency. Sides alternate
within a round and the order flips every round (ours first, then peer first, ...), so a
slow drift of the machine hits both sides alike. Throughput is reported as the median
over rounds, latency percentiles over all recorded operations, and the ratio as the
median over rounds of ``ours ops/s / peer ops/s`` of that round (higher is better for
us); the spread of those per-round ratios shows how noisy the machine was.
"""

from __future__ import annotations

import cProfile
import json
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SIDES = ("ours", "peer")


@dataclass
class Sample:
    """One batch of operations of one side in one round."""

    ops: int
    seconds: float
    latencies: list[float]  # seconds, one per operation
    client_cpu_s: float = 0.0  # this process's CPU time over the batch (all threads)
    server_cpu_s: float | None = None  # CPU of the side's Postgres backends, when local
    proxy_cpu_s: float | None = None  # CPU of the delay proxy (another process), if any

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_ms_per_op(self) -> float | None:
        """Client + server CPU per operation: unlike wall time, hardly moved by what
        else the machine runs. None when the server's CPU cannot be read."""
        if self.server_cpu_s is None:
            return None
        return (self.client_cpu_s + self.server_cpu_s) * 1e3 / max(1, self.ops)


class Timer:
    """Collects per-operation latencies of a batch; ``sample()`` closes it.

    ``server_cpu`` returns the CPU seconds used so far by the Postgres backends serving
    the measured side (or None when they are not on this machine); ``proxy_cpu`` the CPU
    seconds of the delay proxy's process so far (None: no proxy on this path)."""

    def __init__(
        self,
        server_cpu: Callable[[], float | None] | None = None,
        proxy_cpu: Callable[[], float | None] | None = None,
    ) -> None:
        self.latencies: list[float] = []
        self._server_cpu = server_cpu
        self._server0 = server_cpu() if server_cpu is not None else None
        self._proxy_cpu = proxy_cpu
        self._proxy0 = proxy_cpu() if proxy_cpu is not None else None
        self._cpu0 = time.process_time()
        self._start = time.perf_counter()

    @contextmanager
    def op(self) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.latencies.append(time.perf_counter() - t0)

    def add(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def sample(self, ops: int | None = None) -> Sample:
        elapsed = time.perf_counter() - self._start
        cpu = time.process_time() - self._cpu0
        server = None
        if self._server_cpu is not None and self._server0 is not None:
            now = self._server_cpu()
            server = now - self._server0 if now is not None else None
        proxy = None
        if self._proxy_cpu is not None and self._proxy0 is not None:
            now = self._proxy_cpu()
            proxy = now - self._proxy0 if now is not None else None
        n = ops if ops is not None else len(self.latencies)
        return Sample(n, elapsed, self.latencies, cpu, server, proxy)


def process_cpu_s(pids: Sequence[int]) -> float | None:
    """Summed CPU seconds of local processes (Linux /proc), else None.

    ``/proc/PID/schedstat`` counts nanoseconds; ``/proc/PID/stat`` (the fallback) counts
    clock ticks of 10 ms, too coarse for a backend's share of a few graph runs."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Summary:
    ops_per_s: float  # median over rounds
    p50_ms: float  # over every operation of every round
    p95_ms: float
    rounds: int
    ops: int
    cpu_ms_per_op: float | None  # median over rounds of client + server CPU per operation

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Summary:
        lat = [x for s in samples for x in s.latencies]
        cpu = [c for s in samples if (c := s.cpu_ms_per_op) is not None]
        return cls(
            ops_per_s=statistics.median(s.ops_per_s for s in samples),
            p50_ms=percentile(lat, 50) * 1e3,
            p95_ms=percentile(lat, 95) * 1e3,
            rounds=len(samples),
            ops=sum(s.ops for s in samples),
            cpu_ms_per_op=statistics.median(cpu) if len(cpu) == len(samples) else None,
        )


@dataclass
class WorkloadResult:
    name: str
    description: str
    target: float  # minimum acceptable ratio ours/peer
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {s: [] for s in SIDES})

    def complete(self) -> bool:
        return all(self.samples[s] for s in SIDES)

    def summary(self, side: str) -> Summary:
        return Summary.of(self.samples[side])

    @property
    def ratio(self) -> float:
        """Median of the per-round paired ratios: both samples of a pair ran back to back,
        so a burst of load from elsewhere on the machine mostly cancels out."""
        return statistics.median(self.round_ratios())

    @property
    def ratio_of_medians(self) -> float:
        return self.summary("ours").ops_per_s / self.summary("peer").ops_per_s

    def round_ratios(self) -> list[float]:
        """Ratio of each round's paired samples: their spread shows the noise."""
        return [
            o.ops_per_s / p.ops_per_s
            for o, p in zip(self.samples["ours"], self.samples["peer"], strict=False)
        ]

    @property
    def cpu_ratio(self) -> float | None:
        """Peer CPU per op / ours (higher is better for us), from the medians."""
        o, p = self.summary("ours").cpu_ms_per_op, self.summary("peer").cpu_ms_per_op
        return p / o if o and p else None

    def status(self) -> str:
        return "ok" if self.ratio >= self.target else "BELOW"


def side_order(round_index: int) -> tuple[str, str]:
    """Ours first in even rounds, the peer first in odd ones."""
    return SIDES if round_index % 2 == 0 else (SIDES[1], SIDES[0])


def format_table(results: Sequence[WorkloadResult]) -> str:
    header = (
        f"{'workload':<22} {'ours ops/s':>11} {'peer ops/s':>11} {'ratio':>7} "
        f"{'rounds min-max':>15} {'ours p50/p95 ms':>16} {'peer p50/p95 ms':>16} "
        f"{'target':>7}  status  {'cpu ms/op ours/peer':>20} {'cpu ratio':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        if not r.complete():
            continue
        o, p = r.summary("ours"), r.summary("peer")
        rr = r.round_ratios()
        lines.append(
            f"{r.name:<22} {o.ops_per_s:>11.1f} {p.ops_per_s:>11.1f} {r.ratio:>6.2f}x "
            f"{f'{min(rr):.2f}-{max(rr):.2f}x':>15} "
            f"{f'{o.p50_ms:.2f}/{o.p95_ms:.2f}':>16} {f'{p.p50_ms:.2f}/{p.p95_ms:.2f}':>16} "
            f"{f'>={r.target:.1f}x':>7}  {r.status():<6}  {_cpu_cell(o, p):>20} "
            f"{f'{r.cpu_ratio:.2f}x' if r.cpu_ratio else 'n/a':>9}"
        )
    return "\n".join(lines)


def _cpu_cell(o: Summary, p: Summary) -> str:
    if o.cpu_ms_per_op is None or p.cpu_ms_per_op is None:
        return "n/a"
    return f"{o.cpu_ms_per_op:.2f}/{p.cpu_ms_per_op:.2f}"


def to_json(results: Sequence[WorkloadResult], meta: dict[str, Any]) -> str:
    out: dict[str, Any] = {"meta": meta, "workloads": {}}
    for r in results:
        if not r.complete():
            continue
        out["workloads"][r.name] = {
            "description": r.description,
            "target": r.target,
            "ratio": r.ratio,
            "ratio_of_medians": r.ratio_of_medians,
            "cpu_ratio": r.cpu_ratio,
            "round_ratios": r.round_ratios(),
            "status": r.status(),
            **{side: asdict(r.summary(side)) for side in SIDES},
        }
    return json.dumps(out, indent=2)


class Profiler:
    """Optional cProfile of each measured batch, one .prof file per workload and side
    (``python -m pstats FILE`` or snakeviz to read). Profiling slows both sides: do not
    read the table of a profiled run as a result."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._profiles: dict[tuple[str, str], cProfile.Profile] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def around(self, workload: str, side: str) -> Iterator[None]:
        if self.directory is None:
            yield
            return
        prof = self._profiles.setdefault((workload, side), cProfile.Profile())
        prof.enable()
        try:
            yield
        finally:
            prof.disable()

    def wrap(self, workload: str, side: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` profiled in whatever thread it runs in (cProfile is per thread)."""

        def run() -> Any:
            with self.around(workload, side):
                return fn()

        return run

    def dump(self) -> list[Path]:
        if self.directory is None:
            return []
        written = []
        for (workload, side), prof in self._profiles.items():
            path = self.directory / f"{workload}.{side}.prof"
            prof.dump_stats(path)
            written.append(path)
        return written


def trace_counts(conn: Any, fn: Callable[[], Any]) -> dict[str, float]:
    """Run ``fn`` once with a libpq trace on ``conn`` (a psycopg ``Connection``) and count
    its protocol messages: round trips (``rt``: Syncs and simple Queries), statements
    executed, statements parsed, and KB sent. Exact, unlike any timing."""
    from psycopg import pq

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
