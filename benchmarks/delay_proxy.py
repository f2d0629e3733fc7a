"""A TCP proxy that adds a fixed delay to every round trip: Postgres "1 ms away" on one
machine, without root or ``tc netem`` (not available here: the kernel has no
``sch_netem``; and on loopback it would slow every other process on the host too).

It listens on 127.0.0.1 and forwards to a unix socket (the embedded Postgres listens on
nothing else) or a TCP address. Each chunk read is sent on to the other side half the
round-trip delay after it was read, in order; chunks in flight overlap, so, like netem's
delay (and unlike a slow link), pipelined messages pay the delay once, not once each.

Threads and ``time.sleep`` (clock_nanosleep, ~0.1 ms late), not asyncio: asyncio's
timers round a sleep up to whole milliseconds of epoll timeout, so "1 ms each way"
became 2.4-3.3 ms per round trip (measured: asking 1 ms added 2.43 ms, asking 0.5 ms
each way 2.58 ms; this proxy: 1.0 ms asked, 1.0-1.2 ms added). The benchmark still
measures the round trip the proxy really adds (``SELECT 1``) and prints it.

Two engines: ``relay`` (the default) moves every connection through two threads, one
that reads whatever is readable (epoll, which only waits for data, so its millisecond
timeout rounding does not matter) and one that sleeps until the oldest chunk is due and
sends every chunk due by then; ``threads`` (the first engine) runs two threads per
direction of every connection (40 for two pools of 10). The proxy's CPU competes with
the benchmark for the same cores, and a real network costs the application host none:
:class:`Proxy` reads it (``cpu_s``) so the benchmarks print it per run.

Run in its own process (its CPU is then not counted as the client's):
``python benchmarks/delay_proxy.py --unix /tmp/x/.s.PGSQL.5432 --rtt-ms 1``
prints ``listening 127.0.0.1 PORT`` once ready and serves until stdin closes.
:func:`start_proxy` does that from Python and returns a :class:`Proxy` (port, pid, stop).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path


def _sleep_overshoot() -> float:
    """How late ``time.sleep`` wakes up here (median of a few short sleeps): subtracted
    from each wait, so that the delay added is the one asked for, not ~0.1 ms more."""
    late = []
    for _ in range(25):
        t0 = time.monotonic()
        time.sleep(0.0003)
        late.append(time.monotonic() - t0 - 0.0003)
    return sorted(late)[len(late) // 2]


_OVERSHOOT = 0.0
ENGINES = ("relay", "threads")


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Forward ``src`` to ``dst``, each chunk ``delay`` seconds after it arrived."""
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def send() -> None:
        try:
            while True:
                due, chunk = chunks.get()
                if not chunk:
                    break
                wait = due - time.monotonic() - _OVERSHOOT
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        while chunk := src.recv(65536):
            chunks.put((time.monotonic() + delay, chunk))
    except OSError:
        pass
    chunks.put((0.0, b""))
    sender.join()


def _connect(target_unix: str | None, target_host: str | None, target_port: int) -> socket.socket:
    if target_unix is not None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(target_unix)
        return upstream
    upstream = socket.create_connection((target_host, target_port))
    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return upstream


def serve(
    target_unix: str | None,
    target_host: str | None,
    target_port: int,
    rtt_ms: float,
    engine: str = "relay",
) -> None:
    global _OVERSHOOT
    delay = rtt_ms / 2000  # half of the round trip each way
    _OVERSHOOT = _sleep_overshoot()
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening 127.0.0.1 {listener.getsockname()[1]}", flush=True)
    if engine == "relay":
        relay = _Relay(listener, delay, partial(_connect, target_unix, target_host, target_port))
        threading.Thread(target=relay.read, daemon=True).start()
        threading.Thread(target=relay.send, daemon=True).start()
    else:
        _serve_threads(listener, target_unix, target_host, target_port, delay)
    # Serve until our parent closes stdin (or dies): no orphaned proxy.
    sys.stdin.read()
    listener.close()


class _Pair:
    """A client connection and its upstream: how many of its two directions are open."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.a, self.b, self.open = a, b, 2

    def half_closed(self, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        self.open -= 1
        if self.open == 0:
            self.a.close()
            self.b.close()


class _Relay:
    """Every connection through two threads: one reads whatever is readable (epoll, no
    timeout: it only waits for data) and stamps it; the other sleeps until the oldest
    chunk is due and sends every chunk due by then, a connection's chunks joined into one
    send. The delay is the same for all, so the chunks are due in the order they were
    read: a FIFO, no heap. The first engine woke three times per chunk (its reader, its
    sender from the queue, then from the sleep), each wake-up a GIL hand-over among 40
    threads; here one wake-up serves every chunk readable, or due, at once."""

    def __init__(
        self, listener: socket.socket, delay: float, connect: Callable[[], socket.socket]
    ) -> None:
        self.listener, self.delay, self.connect = listener, delay, connect
        self.poll = select.epoll()
        self.route: dict[int, tuple[socket.socket, socket.socket, _Pair]] = {}  # fd -> src, dst
        self.due: deque[tuple[float, socket.socket, bytes, _Pair]] = deque()
        self.ready = threading.Condition()

    def read(self) -> None:
        listener_fd = self.listener.fileno()
        self.poll.register(listener_fd, select.EPOLLIN)
        while True:
            events = self.poll.poll()
            due = time.monotonic() + self.delay
            batch = []
            for fd, _ in events:
                if fd == listener_fd:
                    self._accept()
                    continue
                route = self.route.get(fd)
                if route is None:
                    continue
                src, dst, pair = route
                try:
                    chunk = src.recv(262144)
                except OSError:
                    chunk = b""
                if not chunk:  # end of this direction: passed on after the delay too
                    self.poll.unregister(fd)
                    del self.route[fd]
                batch.append((due, dst, chunk, pair))
            if batch:
                with self.ready:
                    idle = not self.due
                    self.due.extend(batch)
                    if idle:
                        self.ready.notify()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream = self.connect()
        except OSError:
            client.close()
            return
        pair = _Pair(client, upstream)
        self.route[client.fileno()] = (client, upstream, pair)
        self.route[upstream.fileno()] = (upstream, client, pair)
        self.poll.register(client.fileno(), select.EPOLLIN)
        self.poll.register(upstream.fileno(), select.EPOLLIN)

    def send(self) -> None:
        # How late a sleep wakes up, learnt from every sleep (it moves with the machine's
        # load): sleeping that much less keeps the delay at the one asked for.
        late = _OVERSHOOT
        while True:
            with self.ready:
                while not self.due:
                    self.ready.wait()
                first = self.due[0][0]
            wait = first - time.monotonic() - late
            if wait > 0:
                time.sleep(wait)
                woke = time.monotonic()
                late = min(max(0.0, late + 0.1 * (woke - first)), self.delay / 2)
            now = time.monotonic() + late
            with self.ready:
                batch = []
                while self.due and self.due[0][0] <= now:
                    batch.append(self.due.popleft())
            out: dict[socket.socket, list[bytes]] = {}
            for _, dst, chunk, pair in batch:
                if chunk:
                    out.setdefault(dst, []).append(chunk)
                    continue
                if dst in out:  # what was due before the end goes first
                    self._send(dst, out.pop(dst))
                pair.half_closed(dst)
            for dst, chunks in out.items():
                self._send(dst, chunks)

    @staticmethod
    def _send(dst: socket.socket, chunks: list[bytes]) -> None:
        with contextlib.suppress(OSError):
            dst.sendall(chunks[0] if len(chunks) == 1 else b"".join(chunks))


def _serve_threads(
    listener: socket.socket,
    target_unix: str | None,
    target_host: str | None,
    target_port: int,
    delay: float,
) -> None:
    """The first engine (``--engine threads``): two threads per direction of every
    connection, each chunk handed from its reader to its sender through a queue."""

    def handle(client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream = _connect(target_unix, target_host, target_port)
        except OSError:
            client.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client, delay), daemon=True)
        back.start()
        _pump(client, upstream, delay)
        back.join()
        client.close()
        upstream.close()

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


@dataclass
class Proxy:
    """A running proxy process: its local port, its pid (to read its CPU) and ``stop``."""

    port: int
    pid: int
    stop: Callable[[], None]

    def cpu_s(self) -> float | None:
        """CPU seconds the proxy (all its threads) has used so far (Linux /proc), or
        None. It runs beside the benchmark on the same cores: an artefact of the
        benchmark, since a real network costs the application host no such CPU."""
        try:  # nanoseconds per thread (the proxy's threads live as long as it does)
            tasks = Path(f"/proc/{self.pid}/task").iterdir()
            return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        try:  # clock ticks of 10 ms, every thread's, exited ones' too
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / tick


def start_proxy(
    *,
    unix: str | None = None,
    host: str | None = None,
    port: int = 5432,
    rtt_ms: float = 1.0,
    engine: str = "relay",
) -> Proxy:
    """Start the proxy in a child process."""
    argv = [sys.executable, __file__, "--rtt-ms", str(rtt_ms), "--engine", engine]
    argv += ["--unix", unix] if unix is not None else ["--host", str(host), "--port", str(port)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline().split()
    if len(line) != 3 or line[0] != "listening":
        proc.kill()
        raise RuntimeError(f"delay proxy did not start (said {line!r})")

    def stop() -> None:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return Proxy(int(line[2]), proc.pid, stop)


def start(
    *, unix: str | None = None, host: str | None = None, port: int = 5432, rtt_ms: float = 1.0
) -> tuple[int, Callable[[], None]]:
    """Start the proxy in a child process; returns (local port, stop)."""
    proxy = start_proxy(unix=unix, host=host, port=port, rtt_ms=rtt_ms)
    return proxy.port, proxy.stop


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--unix", default=None, help="forward to this unix socket path")
    parser.add_argument("--host", default=None, help="or to this TCP host")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="added per round trip")
    parser.add_argument(
        "--engine", choices=ENGINES, default="relay",
        help="relay: two threads for all connections; threads: two per direction (the first)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if (args.unix is None) == (args.host is None):
        parser.error("give exactly one of --unix and --host")
    serve(args.unix, args.host, args.port, args.rtt_ms, args.engine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
