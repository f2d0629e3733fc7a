"""A TCP proxy that delays every chunk by a fixed time in each direction: Postgres "1 ms
away" on one machine, without root or ``tc netem`` (which on loopback would slow every
other process on the host too).

It listens on 127.0.0.1 and forwards to a unix socket (the embedded Postgres listens on
nothing else) or a TCP address. Each chunk read is written to the other side ``delay`` ms
after it was read, in order; chunks in flight overlap, so, like netem's delay (and unlike
a slow link), pipelined messages pay the delay once, not once each. asyncio's timers
have millisecond granularity: the added delay is 1-2 ms per direction, so the benchmark
measures the round trip the proxy actually adds and prints it.

Run in its own process (its CPU is then not counted as the client's):
``python benchmarks/delay_proxy.py --unix /tmp/x/.s.PGSQL.5432 --delay-ms 1``
prints ``listening 127.0.0.1 PORT`` once ready and serves until stdin closes.
:func:`start` does that from Python and returns the port and a stop function.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Callable, Sequence


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            chunk = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, chunk))
            if not chunk:
                break
    except (ConnectionError, OSError):
        queue.put_nowait((0.0, b""))
    with contextlib.suppress(ConnectionError, OSError):
        await sender


async def serve(
    target_unix: str | None, target_host: str | None, target_port: int, delay_ms: float
) -> None:
    delay = delay_ms / 1000

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            if target_unix is not None:
                s_reader, s_writer = await asyncio.open_unix_connection(target_unix)
            else:
                s_reader, s_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(_pump(c_reader, s_writer, delay), _pump(s_reader, c_writer, delay))
        except asyncio.CancelledError:  # shutting down: end quietly
            c_writer.close()
            s_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening 127.0.0.1 {port}", flush=True)
    loop = asyncio.get_running_loop()
    # Serve until our parent closes stdin (or dies): no orphaned proxy.
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


def start(
    *, unix: str | None = None, host: str | None = None, port: int = 5432, delay_ms: float = 1.0
) -> tuple[int, Callable[[], None]]:
    """Start the proxy in a child process; returns (local port, stop)."""
    argv = [sys.executable, __file__, "--delay-ms", str(delay_ms)]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unix", default=None, help="forward to this unix socket path")
    parser.add_argument("--host", default=None, help="or to this TCP host")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--delay-ms", type=float, default=1.0, help="per direction")
    args = parser.parse_args(argv)
    if (args.unix is None) == (args.host is None):
        parser.error("give exactly one of --unix and --host")
    asyncio.run(serve(args.unix, args.host, args.port, args.delay_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
