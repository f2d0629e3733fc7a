"""A TCP proxy that adds a fixed delay to every round trip: Postgres "1 ms away" on one
machine, without root or ``tc netem`` (not available here: the kernel has no
``sch_netem``; and on loopback it would slow every other process on the host too).

It listens on 127.0.0.1 and forwards to a unix socket (the embedded Postgres listens on
nothing else) or a TCP address. Each chunk read is sent on to the other side half the
round-trip delay after it was read, in order; chunks in flight overlap, so, like netem's
delay (and unlike a slow link), pipelined messages pay the delay once, not once each.

Plain threads and ``time.sleep`` (clock_nanosleep, ~0.1 ms late), not asyncio: asyncio's
timers round a sleep up to whole milliseconds of epoll timeout, so "1 ms each way"
became 2.4-3.3 ms per round trip (measured: asking 1 ms added 2.43 ms, asking 0.5 ms
each way 2.58 ms; this proxy: 1.0 ms asked, 1.0-1.2 ms added). The benchmark still measures the round trip the proxy
really adds (``SELECT 1``) and prints it.

Run in its own process (its CPU is then not counted as the client's):
``python benchmarks/delay_proxy.py --unix /tmp/x/.s.PGSQL.5432 --rtt-ms 1``
prints ``listening 127.0.0.1 PORT`` once ready and serves until stdin closes.
:func:`start` does that from Python and returns the port and a stop function.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence


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


def serve(target_unix: str | None, target_host: str | None, target_port: int, rtt_ms: float) -> None:
    global _OVERSHOOT
    delay = rtt_ms / 2000  # half of the round trip each way
    _OVERSHOOT = _sleep_overshoot()
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening 127.0.0.1 {listener.getsockname()[1]}", flush=True)

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
    # Serve until our parent closes stdin (or dies): no orphaned proxy.
    sys.stdin.read()
    listener.close()


def start(
    *, unix: str | None = None, host: str | None = None, port: int = 5432, rtt_ms: float = 1.0
) -> tuple[int, Callable[[], None]]:
    """Start the proxy in a child process; returns (local port, stop)."""
    argv = [sys.executable, __file__, "--rtt-ms", str(rtt_ms)]
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

    return int(line[2]), stop


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--unix", default=None, help="forward to this unix socket path")
    parser.add_argument("--host", default=None, help="or to this TCP host")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="added per round trip")
    args = parser.parse_args(argv)
    if (args.unix is None) == (args.host is None):
        parser.error("give exactly one of --unix and --host")
    serve(args.unix, args.host, args.port, args.rtt_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
