"""The Celery and Temporal pages run as written: every python block of the page is a whole
file (its first line names it: ``# tasks.py``), written to a directory as is; the page's
shell block runs there line by line (``export`` lines take the fixtures' servers and
database instead of the placeholders; ``pip install`` is this environment; a command
ending in ``&`` or a worker runs in the background until the test ends); the block that
sends work prints what its comment says."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.orchestrators.servers import RedisServer, TemporalDevServer

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def page_files(page: str) -> tuple[dict[str, str], list[str]]:
    """{file name: code} of the page's python blocks, and its shell blocks' lines."""
    text = (REPO / "docs" / "how-to" / page).read_text("utf-8")
    files: dict[str, str] = {}
    for code in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL):
        first = code.splitlines()[0]
        assert re.fullmatch(r"# \w+\.py", first), f"{page}: a python block is not a file: {first!r}"
        files[first[2:]] = code
    lines = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    return files, lines


SERVERS = ("redis-server", "temporal server")  # the fixtures run these


@contextlib.contextmanager
def shell(lines: list[str], cwd: Path, env: dict[str, str]) -> Iterator[str]:
    """Run the page's shell lines (background ones until the block ends); yields what the
    foreground ``python`` lines printed."""
    background: list[subprocess.Popen[bytes]] = []
    printed = ""
    try:
        for line in lines:
            if line.startswith("pip install") or line.startswith(SERVERS):
                continue  # this environment has the extras; the fixtures run the servers
            if line.startswith("export "):
                for name, _, _ in (part.partition("=") for part in shlex.split(line)[1:]):
                    assert name in env, f"the page exports {name}, which the test cannot set"
                continue
            argv = shlex.split(line.removesuffix("&").strip())
            argv[0] = str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0]
            if line.endswith("&"):
                log = open(cwd / f"{Path(argv[0]).name}.log", "wb")  # noqa: SIM115
                background.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))  # fmt: skip
            else:
                if argv[0] == "python":
                    argv[0] = sys.executable
                done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                      timeout=180)  # fmt: skip
                logs = "".join(p.read_text(errors="replace")[-3000:] for p in cwd.glob("*.log"))
                assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr[-4000:]}{logs}"
                printed += done.stdout
        yield printed
    finally:
        for proc in background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in background:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def announced(code: str) -> list[str]:
    """What a block's comments say it prints (``print(...)  # Done: ...``)."""
    return [m.strip() for m in re.findall(r"print\(.*\)\s+# (.+)$", code, flags=re.MULTILINE)]


def base_env(db: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": db,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}  # fmt: skip


def run_page(page: str, names: set[str], tmp_path: Path, env: dict[str, str]) -> None:
    files, lines = page_files(page)
    assert set(files) == names, files
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    expected = [said for code in files.values() for said in announced(code)]
    assert expected, f"{page}: no block says what it prints"
    with shell(lines, tmp_path, env) as printed:
        for said in expected:
            assert said in printed, (said, printed)


def test_the_celery_page_runs_as_written(
    db: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    env = {**base_env(db, tmp_path), "CELERY_BROKER_URL": redis_server.url}
    run_page("celery.md", {"tasks.py", "send.py"}, tmp_path, env)


def test_the_temporal_page_runs_as_written(
    db: str, temporal_server: TemporalDevServer, tmp_path: Path
) -> None:
    env = {**base_env(db, tmp_path), "TEMPORAL_ADDRESS": temporal_server.address}
    run_page("temporal.md", {"worker.py", "start.py"}, tmp_path, env)


@pytest.mark.parametrize("page", ["celery.md", "temporal.md"])
def test_the_pages_name_every_block_as_a_file(page: str) -> None:
    files, lines = page_files(page)
    assert files and any("worker" in line and line.endswith("&") for line in lines)
