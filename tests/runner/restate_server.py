"""A real restate-server (from npm) and our service (hypercorn) for the end-to-end tests.

* ``ensure_binary()`` installs ``@restatedev/restate-server-linux-x64@1.7.12`` with
  ``npm install --prefix <cache>`` (cache: ``$LGD_CACHE_DIR/restate-server``, else
  ``<repo>/.cache/restate-server``) and returns the binary, or raises
  ``RestateUnavailable`` with the reason.
* ``restate_server()`` is the package's own launcher (``_restate_local.LocalRestate``,
  what ``demo --restate`` runs) with the tests' settings; ``forced_replay=True`` makes
  the service suspend (and later replay) after every durable step.
* ``ServiceProcess`` runs ``tests/runner/restate_app.py`` under hypercorn in a
  subprocess, so a test can ``kill -9`` it and start it again on the same port.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from langgraph_deterministic.demos._restate_local import (
    RESTATE_VERSION,
    LocalRestate,
    free_port,
    http,
)

RESTATE_PACKAGE = "@restatedev/restate-server-linux-x64"
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class RestateUnavailable(RuntimeError):
    """restate-server cannot be had on this machine (the reason says why)."""


def cache_dir() -> Path:
    root = os.environ.get("LGD_CACHE_DIR")
    return Path(root) / "restate-server" if root else REPO / ".cache" / "restate-server"


def ensure_binary() -> Path:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RestateUnavailable(
            f"{RESTATE_PACKAGE} is built for linux x86_64, not {sys.platform}/{platform.machine()}"
        )
    cache = cache_dir()
    binary = cache / "node_modules" / RESTATE_PACKAGE / "bin" / "restate-server"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one npm install at a time (xdist, parallel CI jobs)
        if binary.exists() and _version_ok(binary):
            return binary
        npm = shutil.which("npm")
        if npm is None:
            raise RestateUnavailable("npm is not on PATH (needed to fetch restate-server)")
        try:
            proc = subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(cache),
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                    f"{RESTATE_PACKAGE}@{RESTATE_VERSION}",
                ],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RestateUnavailable(f"npm install of {RESTATE_PACKAGE} timed out") from exc
        if proc.returncode != 0 or not binary.exists():
            raise RestateUnavailable(
                f"npm install {RESTATE_PACKAGE}@{RESTATE_VERSION} failed "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-800:]}"
            )
        if not _version_ok(binary):
            raise RestateUnavailable(f"{binary} does not report version {RESTATE_VERSION}")
        return binary


def _version_ok(binary: Path) -> bool:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return RESTATE_VERSION in out.stdout


def _wait_port(port: int, deadline: float, proc: subprocess.Popen[Any], what: str) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port}")


def restate_server(binary: Path, *, forced_replay: bool) -> LocalRestate:
    """The package's own launcher (the one ``demo --restate`` runs), with the tests'
    settings: two partitions, generous timeouts for a loaded CI machine, and no
    PR_SET_PDEATHSIG (a fixture may start it from a thread that ends first)."""
    return LocalRestate(
        binary,
        forced_replay=forced_replay,
        partitions=2,
        node_name="lgd-test",
        start_timeout=60.0,
        http_timeout=60.0,
        die_with_parent=False,
    )


class ServiceProcess:
    """``hypercorn restate_app:app`` on a fixed loopback port, restartable after kill -9."""

    def __init__(
        self, port: int | None = None, app: str = "restate_app:app", cwd: Path = HERE
    ) -> None:
        self.port = port or free_port()
        self.app = app
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="lgd-service-", suffix=".log")[1])

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), str(REPO / "src"), env.get("PYTHONPATH", "")]
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hypercorn",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--graceful-timeout",
                "0",
                self.app,
            ],
            cwd=str(self.cwd),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(self.port, time.monotonic() + 60, self.proc, "hypercorn service")

    def kill9(self) -> None:
        """SIGKILL the service's whole process group (hypercorn may fork a worker)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: pgid == pid
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            self.kill9()
        self.proc = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class RestateEnv:
    """One server + one registered service: what a test talks to."""

    def __init__(self, binary: Path, *, forced_replay: bool) -> None:
        self.server = restate_server(binary, forced_replay=forced_replay)
        self.service = ServiceProcess()
        self.forced_replay = forced_replay

    def start(self) -> RestateEnv:
        self.server.start()
        try:
            self.service.start()
            self.server.register(self.service.uri)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.service.stop()
        self.server.stop()

    def call(self, handler: str, body: Any, timeout: float = 60.0) -> tuple[int, Any]:
        return http("POST", f"{self.server.ingress}/Graphs/{handler}", body, timeout=timeout)

    def send(self, handler: str, body: Any) -> str:
        status, out = http("POST", f"{self.server.ingress}/Graphs/{handler}/send", body)
        if status >= 300:
            raise RuntimeError(f"send failed: {status} {out}")
        return str(out["invocationId"])

    def attach(self, invocation_id: str, timeout: float = 60.0) -> tuple[int, Any]:
        return http(
            "GET",
            f"{self.server.ingress}/restate/invocation/{invocation_id}/attach",
            timeout=timeout,
        )
