"""A real ``langgraph dev`` (langgraph-api on its in-memory runtime) on loopback, serving
a project made from docs/how-to/langgraph-server.md's langgraph.json block as is and the
graph in ``app/graph.py``.

The server runs on ``$LGD_SERVER_PYTHON`` (a venv with the ``server`` extra: its pins of
protobuf differ from the test extra's, so CI keeps it apart), else on this interpreter.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "langgraph-server.md"
APP = Path(__file__).resolve().parent / "app"


class ServerUnavailable(RuntimeError):
    pass


def server_python() -> str:
    return os.environ.get("LGD_SERVER_PYTHON") or sys.executable


def check_available() -> None:
    python = server_python()
    probe = subprocess.run(
        [python, "-c", "import langgraph_api, langgraph_cli, langgraph_runtime_inmem"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        raise ServerUnavailable(
            f"{python} has no langgraph-cli[inmem] (pip install "
            "'langgraph-deterministic[server]' into a venv and point LGD_SERVER_PYTHON at "
            f"its python): {probe.stderr.strip().splitlines()[-1:]}"
        )


def page_langgraph_json() -> str:
    """The langgraph.json block of the how-to page, exactly as shown."""
    blocks = re.findall(r"```json\n(.*?)```", PAGE.read_text(), flags=re.S)
    found = [b for b in blocks if '"checkpointer"' in b]
    if not found:
        raise AssertionError(f"{PAGE} has no langgraph.json block with a checkpointer")
    return found[0]


def make_project(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "langgraph.json").write_text(page_langgraph_json())
    shutil.copy(APP / "graph.py", directory / "graph.py")
    return directory


def humans(values: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in values.get("messages", []) if m["type"] == "human"]


def unanswered(values: dict[str, Any]) -> list[str]:
    answered = {m.get("tool_call_id") for m in values.get("messages", []) if m["type"] == "tool"}
    return [
        c["id"]
        for m in values.get("messages", [])
        if m["type"] == "ai"
        for c in m.get("tool_calls") or []
        if c["id"] not in answered
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LangGraphDev:
    """``langgraph dev --no-browser --no-reload`` on 127.0.0.1 in ``project``."""

    def __init__(self, project: Path, dsn: str, *, env: dict[str, str] | None = None) -> None:
        self.project = project
        self.dsn = dsn
        self.port = _free_port()
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = project / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> LangGraphDev:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URI", "DATABASE_URL")}
        env.update(
            POSTGRES_URI=self.dsn,
            LANGSMITH_TRACING="false",
            LANGGRAPH_CLI_NO_ANALYTICS="1",
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        command = [
            server_python(), "-m", "langgraph_cli", "dev", "--no-browser", "--no-reload",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=self.project, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerUnavailable(f"langgraph dev exited: {self.tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/ok", timeout=1) as answer,
            ):
                if answer.status == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise ServerUnavailable(f"langgraph dev did not answer in {timeout} s: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server's whole process group (no shutdown of any kind)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()
