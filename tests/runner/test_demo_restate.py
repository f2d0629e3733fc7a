"""`langgraph-deterministic demo --restate`, in-process through ``cli.main``: a real
restate-server (fetched as the other Restate tests do and handed over in $RESTATE_SERVER),
the demo's own service served in this process, plain LangGraph beside DeterministicRunner.
Also: how the demo finds restate-server, and what it says when there is none."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from langgraph_deterministic.cli import main
from langgraph_deterministic.demos import parallel_restate as demo_restate


def _tables(out: str) -> dict[str, dict[str, list[str]]]:
    """{regime title: {row label: [plain, runner]}} from the demo's two tables."""
    tables: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in out.splitlines():
        if line.startswith("== "):
            current = tables.setdefault(line.strip("= "), {})
        elif current is not None and line[:28].strip() and len(line) > 28:
            cells = re.split(r"\s{2,}", line[28:].strip())
            if len(cells) == 2:
                current[line[:28].strip()] = cells
        elif not line.strip():
            current = None  # a table ends at a blank line
    return tables


def _own_children_running(needle: str) -> list[str]:
    """Command lines of this process's children that mention ``needle``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = re.search(r"^PPid:\s+(\d+)", status, re.M)
        if ppid and int(ppid.group(1)) == os.getpid() and needle in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.restate
def test_demo_restate_replays_parallel_nodes(
    restate_binary: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RESTATE_SERVER", str(restate_binary))
    assert main(["demo", "--restate"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Scenario: ")  # says what it shows before it runs
    assert f"restate-server: {restate_binary}" in out
    tables = _tables(out)
    forced = tables[demo_restate.REGIMES[True]]
    single = tables[demo_restate.REGIMES[False]]
    hang = f"hang (nothing in {demo_restate.HANG_AFTER:.0f} s)"
    n = demo_restate.INVOCATIONS
    for regime in (forced, single):  # ours: every invocation right, every effect once
        assert regime["finished, right result"][1] == f"{n} of {n}"
        assert regime["570 journal mismatch"][1] == "0"
        assert regime[hang][1] == "0"
        assert regime["other failure"][1] == "0"
        assert regime["runs of each side effect"][1] == "1"
    # plain LangGraph under forced replay: 570 in 20 of 20 runs when measured (REFERENCE 2)
    assert int(forced["570 journal mismatch"][0]) >= 1, out
    assert "[570 Journal mismatch]" in out
    assert "6 of 6 invocations finished without a journal mismatch or a hang" in out
    # every process the demo started is gone, and its temp dirs with it
    # the demo's servers (base dirs lgd-demo-restate-*), not the session's test servers
    assert _own_children_running("lgd-demo-restate-") == []


def test_demo_restate_without_a_server_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RESTATE_SERVER", raising=False)
    monkeypatch.delenv("LGD_CACHE_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--restate"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing started, no scenario line
    assert "restate-server not found" in captured.err
    assert (
        "npm install --prefix .cache/restate-server @restatedev/restate-server@"
        + demo_restate.RESTATE_VERSION
    ) in captured.err
    assert "docker compose up --build" in captured.err


def test_demo_restate_refuses_a_bad_restate_server_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_binary = tmp_path / "restate-server"
    not_a_binary.write_text("")  # exists, not executable
    monkeypatch.setenv("RESTATE_SERVER", str(not_a_binary))
    assert main(["demo", "--restate"]) == 2
    err = capsys.readouterr().err
    assert "$RESTATE_SERVER" in err and str(not_a_binary) in err and "unset it" in err


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_locate_restate_server_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$RESTATE_SERVER, then PATH, then a .cache/restate-server npm prefix in
    $LGD_CACHE_DIR, the working directory or a parent (where the tests install it)."""
    monkeypatch.delenv("RESTATE_SERVER", raising=False)
    monkeypatch.delenv("LGD_CACHE_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    project = tmp_path / "project"
    work = project / "src" / "deep"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    with pytest.raises(demo_restate.RestateServerNotFoundError):
        demo_restate.locate_restate_server()

    # npm's launcher of the meta package, found from a subdirectory of the project
    launcher = _executable(project / ".cache/restate-server/node_modules/.bin/restate-server")
    assert demo_restate.locate_restate_server() == launcher
    # the platform package's own binary (what tests/runner/restate_server.py installs) wins
    platform_binary = _executable(
        project
        / ".cache/restate-server/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
    )
    assert demo_restate.locate_restate_server() == platform_binary
    cached = _executable(tmp_path / "cache/restate-server/node_modules/.bin/restate-server")
    monkeypatch.setenv("LGD_CACHE_DIR", str(tmp_path / "cache"))
    assert demo_restate.locate_restate_server() == cached
    on_path = _executable(tmp_path / "bin" / "restate-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert demo_restate.locate_restate_server() == on_path
    explicit = _executable(tmp_path / "elsewhere" / "my-restate")
    monkeypatch.setenv("RESTATE_SERVER", str(explicit))
    assert demo_restate.locate_restate_server() == explicit
