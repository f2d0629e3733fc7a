"""A real restate-server (from npm) and our service (hypercorn) for the end-to-end tests.

* ``ensure_binary()`` installs ``@restatedev/restate-server-linux-x64@1.7.12`` with
  ``npm install --prefix <cache>`` (cache: ``$LGD_CACHE_DIR/restate-server``, else
  ``<repo>/.cache/restate-server``) and returns the binary, or raises
  ``RestateUnavailable`` with the reason.
* ``RestateServer`` runs it on free loopback ports, telemetry off, in a temp base dir;
  ``forced_replay=True`` sets ``[worker.invoker] inactivity-timeout = "0s"`` so the
  service suspends (and later replays) after every durable step.
* ``ServiceProcess`` runs ``tests/runner/restate_app.py`` under hypercorn in a
  subprocess, so a test can ``kill -9`` it and start it again on the same port.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

RESTATE_VERSION = "1.7.12"
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def http(method: str, url: str, body: Any = None, timeout: float = 60.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw = err.read()
        status = err.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


class RestateServer:
    def __init__(self, binary: Path, *, forced_replay: bool) -> None:
        self.binary = binary
        self.forced_replay = forced_replay
        self.base = Path(tempfile.mkdtemp(prefix="lgd-restate-"))
        self.admin_port = free_port()
        self.ingress_port = free_port()
        self.fabric_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def ingress(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    def start(self) -> None:
        config = self.base / "restate.toml"
        lines = [
            'bind-ip = "127.0.0.1"',
            f"bind-port = {self.fabric_port}",
            'listen-mode = "tcp"',
            "disable-telemetry = true",
            "default-num-partitions = 2",
            'node-name = "lgd-test"',
            'log-filter = "warn"',
            "[admin]",
            f"bind-port = {self.admin_port}",
            "[ingress]",
            f"bind-port = {self.ingress_port}",
            # retry quickly after a kill -9 of the service
            "[default-retry-policy]",
            'initial-interval = "100ms"',
            "exponentiation-factor = 1.5",
            'max-interval = "1s"',
        ]
        if self.forced_replay:
            lines += ["[worker.invoker]", 'inactivity-timeout = "0s"']
        config.write_text("\n".join(lines) + "\n")
        log = open(self.base / "restate.log", "wb")  # noqa: SIM115 - lives with the process
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_")}
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "--config-file",
                str(config),
                "--base-dir",
                str(self.base / "data"),
                "--no-logo",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        _wait_port(self.admin_port, deadline, self.proc, "restate-server")
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if http("GET", f"{self.admin}/health", timeout=2)[0] == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError("restate-server admin API did not become healthy")

    def register(self, uri: str) -> None:
        status, body = http("POST", f"{self.admin}/deployments", {"uri": uri, "force": True})
        if status >= 300:
            raise RuntimeError(f"registering {uri} failed: {status} {body}")

    def query(self, sql: str) -> list[dict[str, Any]]:
        status, body = http("POST", f"{self.admin}/query", {"query": sql})
        if status >= 300:
            raise RuntimeError(f"query failed: {status} {body}")
        return list(body.get("rows", [])) if isinstance(body, dict) else []

    def log_text(self) -> str:
        p = self.base / "restate.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.base, ignore_errors=True)


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
        self.server = RestateServer(binary, forced_replay=forced_replay)
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
