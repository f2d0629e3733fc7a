"""A local restate-server: found on this machine, started on free loopback ports, stopped.

Used by ``langgraph-deterministic demo --restate`` and by the end-to-end tests (which fetch
the binary first: tests/runner/restate_server.py), so the server the tests run is the one
the demo runs. Not a production launcher: telemetry off, one node, a temp base dir.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
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

from langgraph_deterministic.errors import ConfigurationError, DeterministicError

RESTATE_VERSION = "1.7.12"  # what the tests fetch and what our figures were measured on


class RestateServerNotFoundError(ConfigurationError):
    """No restate-server binary could be found (the message says how to get one)."""


class RestateDemoError(DeterministicError, RuntimeError):
    """restate-server or the demo's service did not start or answer (the message says
    where its log is)."""


# -- finding restate-server -------------------------------------------------------------


def cache_dirs() -> list[Path]:
    """The npm prefixes searched: ``$LGD_CACHE_DIR/restate-server``, then
    ``.cache/restate-server`` in the working directory and each of its parents."""
    dirs = []
    if os.environ.get("LGD_CACHE_DIR"):
        dirs.append(Path(os.environ["LGD_CACHE_DIR"]) / "restate-server")
    cwd = Path.cwd().resolve()
    dirs += [d / ".cache" / "restate-server" for d in (cwd, *cwd.parents)]
    return dirs


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_restate_server() -> Path:
    """Return a restate-server binary, or raise RestateServerNotFoundError saying how to
    get one."""
    explicit = os.environ.get("RESTATE_SERVER")
    if explicit:
        if _executable(Path(explicit)):
            return Path(explicit)
        raise RestateServerNotFoundError(
            f"$RESTATE_SERVER is {explicit!r}, which is not an executable file. "
            "Point it at a restate-server binary, or unset it."
        )
    on_path = shutil.which("restate-server")
    if on_path:
        return Path(on_path)
    for prefix in cache_dirs():
        modules = prefix / "node_modules"
        # the platform package's binary (what the tests fetch), then npm's launcher for
        # the @restatedev/restate-server meta package (needs node)
        candidates = sorted(modules.glob("@restatedev/restate-server-*/bin/restate-server"))
        candidates.append(modules / ".bin" / "restate-server")
        for candidate in candidates:
            if _executable(candidate):
                return candidate
    raise RestateServerNotFoundError(how_to_get_restate_server())


def how_to_get_restate_server() -> str:
    return (
        "restate-server not found: looked at $RESTATE_SERVER, PATH and "
        f"{', '.join(str(d) for d in cache_dirs()[:2])} (and the working directory's "
        "parents). Get one, then run this again from the same directory:\n"
        f"  npm install --prefix .cache/restate-server @restatedev/restate-server@{RESTATE_VERSION}\n"
        "or put a restate-server binary on PATH or in $RESTATE_SERVER (releases: "
        "https://github.com/restatedev/restate/releases). `docker compose up --build` "
        "runs the same runner in containers (see README), without this side-by-side."
    )


# -- every piece `demo --restate` needs, named at once -------------------------------------

# the restate extra's distributions, and the module each provides
_EXTRA_MODULES = {"restate-sdk": "restate", "hypercorn": "hypercorn"}
_EXTRA_FALLBACK = ("restate-sdk[serde]>=1.3,<1.4", "hypercorn>=0.17")


def restate_extra() -> list[str]:
    """The requirements of this package's ``restate`` extra, as its metadata states them."""
    from importlib import metadata

    try:
        requires = metadata.requires("langgraph-deterministic") or []
    except metadata.PackageNotFoundError:
        return list(_EXTRA_FALLBACK)
    found = []
    for req in requires:
        spec, _, marker = req.partition(";")
        if "extra" in marker and "restate" in marker.split("==")[-1]:
            found.append(spec.strip())
    return found or list(_EXTRA_FALLBACK)


def _requirement_name(spec: str) -> str:
    return spec.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()


def missing_demo_pieces() -> str | None:
    """None when ``demo --restate`` has all it needs; else one message naming every missing
    piece and one command that gets them all."""
    import importlib.util
    import shlex

    pieces: list[str] = []
    commands: list[str] = []
    try:
        locate_restate_server()
        server_missing = False
    except RestateServerNotFoundError:
        if os.environ.get("RESTATE_SERVER"):
            raise  # the user pointed at something that is not a binary: that message
        server_missing = True
    missing = [
        spec
        for spec in restate_extra()
        if (module := _EXTRA_MODULES.get(_requirement_name(spec))) is not None
        and importlib.util.find_spec(module) is None
    ]
    python = shlex.quote(sys.executable)
    if missing:
        pieces.append(
            "the Python package(s) of the restate extra not installed in "
            f"{sys.executable}: {', '.join(missing)}"
        )
        commands.append(f"{python} -m pip install {' '.join(shlex.quote(m) for m in missing)}")
    if server_missing:
        pieces.append(
            "restate-server not found (looked at $RESTATE_SERVER, PATH and "
            f"{', '.join(str(d) for d in cache_dirs()[:2])} and the working directory's "
            "parents)"
        )
        commands.append(
            f"npm install --prefix .cache/restate-server @restatedev/restate-server@{RESTATE_VERSION}"
        )
    if not pieces:
        return None
    commands.append(f"{python} -m langgraph_deterministic demo --restate")
    npm_note = ""
    if server_missing and shutil.which("npm") is None:
        npm_note = (
            " npm is not on PATH either: install Node.js (it brings npm), or instead of the "
            "npm step put a restate-server binary (https://github.com/restatedev/restate/"
            "releases) on PATH or in $RESTATE_SERVER."
        )
    listed = "; ".join(f"({i}) {p}" for i, p in enumerate(pieces, 1))
    return (
        f"the Restate demo needs {len(pieces)} more piece(s): {listed}. Get "
        f"{'it' if len(pieces) == 1 else 'them all'} and run the demo with one command, "
        f"from this directory:\n  {' && '.join(commands)}\n{npm_note}"
        "(In a checkout of this repository, `bash scripts/demo.sh --restate` does the "
        "same. `docker compose up --build` runs the same runner in containers, without "
        "this side-by-side.)"
    )


# -- restate-server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"content-type": "application/json", "accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _die_with_parent_hook() -> Any:
    """A preexec_fn that makes the child get SIGKILL when this process dies (even by
    SIGKILL), so the demo never leaves a restate-server behind. prctl is looked up here,
    before the fork: the child only calls it."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalRestate:
    """restate-server on free loopback ports, telemetry off, in a temp base dir; with
    ``forced_replay`` the inactivity timeout is 0s (the service suspends after every
    durable step, so each step is followed by a full replay). With ``die_with_parent``
    the server gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG):
    start it from the main thread."""

    def __init__(
        self,
        binary: Path,
        *,
        forced_replay: bool,
        partitions: int = 1,
        node_name: str = "lgd-demo",
        start_timeout: float = 30.0,
        http_timeout: float = 10.0,
        die_with_parent: bool = True,
    ) -> None:
        self.binary = binary
        self.forced_replay = forced_replay
        self.partitions = partitions
        self.node_name = node_name
        self.start_timeout = start_timeout
        self.http_timeout = http_timeout
        self.die_with_parent = die_with_parent
        self.base = Path(tempfile.mkdtemp(prefix=f"{node_name}-restate-"))
        self.admin_port, self.ingress_port, self.fabric_port = (free_port() for _ in range(3))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def ingress(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    @property
    def log_path(self) -> Path:
        return self.base / "restate.log"

    def start(self) -> None:
        config = self.base / "restate.toml"
        config.write_text(
            "\n".join(
                [
                    'bind-ip = "127.0.0.1"',
                    f"bind-port = {self.fabric_port}",
                    'listen-mode = "tcp"',
                    "disable-telemetry = true",
                    f"default-num-partitions = {self.partitions}",
                    f'node-name = "{self.node_name}"',
                    'log-filter = "warn"',
                    "[admin]",
                    f"bind-port = {self.admin_port}",
                    "[ingress]",
                    f"bind-port = {self.ingress_port}",
                    "[default-retry-policy]",  # a failed attempt is retried soon
                    'initial-interval = "100ms"',
                    "exponentiation-factor = 1.5",
                    'max-interval = "1s"',
                ]
            )
            + "\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_")}
        if self.forced_replay:
            env["RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT"] = "0s"
        with open(self.log_path, "wb") as log:
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
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if self.die_with_parent else None,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RestateDemoError(
                    f"restate-server exited with {self.proc.returncode} at start: {self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                if http("GET", f"{self.admin}/health", timeout=1)[0] == 200:
                    return
            time.sleep(0.05)
        raise RestateDemoError(f"restate-server did not become healthy: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_text()[-1500:] or "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def register(self, uri: str) -> None:
        status, body = http(
            "POST",
            f"{self.admin}/deployments",
            {"uri": uri, "force": True},
            timeout=self.http_timeout,
        )
        if status >= 300:
            raise RestateDemoError(f"registering {uri} with restate-server failed: {status} {body}")

    def query(self, sql: str) -> list[dict[str, Any]]:
        status, body = http(
            "POST", f"{self.admin}/query", {"query": sql}, timeout=self.http_timeout
        )
        if status >= 300 or not isinstance(body, dict):
            raise RestateDemoError(f"restate-server query failed: {status} {body}")
        return list(body.get("rows", []))

    def kill_invocation(self, invocation_id: str) -> None:
        url = f"{self.admin}/invocations/{invocation_id}"
        status, _ = http("PATCH", f"{url}/kill", timeout=self.http_timeout)
        if status in (404, 405):  # older servers
            http("DELETE", f"{url}?mode=kill", timeout=self.http_timeout)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)
