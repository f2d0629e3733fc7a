"""``langgraph-deterministic demo --restate`` outside a venv that has everything: one
message names every missing piece (restate-server, the restate extra's packages) with one
command that gets them all; through ``cli.main``. (That the demo itself works, on a real
restate-server: tests/runner/test_demo_restate.py.)"""

from __future__ import annotations

import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from langgraph_deterministic.cli import main
from langgraph_deterministic.demos._restate_local import RESTATE_VERSION, restate_extra


@pytest.fixture()
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No restate-server anywhere the demo looks."""
    monkeypatch.delenv("RESTATE_SERVER", raising=False)
    monkeypatch.delenv("LGD_CACHE_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _without_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restate extra's modules absent, as in a venv made without it."""
    for module in ("restate", "hypercorn"):
        monkeypatch.setitem(sys.modules, module, None)  # find_spec: None, import: an error


def _command(err: str) -> str:
    (line,) = [ln.strip() for ln in err.splitlines() if " -m langgraph_deterministic demo" in ln]
    return line


def test_the_extra_metadata_is_read() -> None:
    requires = metadata.requires("langgraph-deterministic") or []
    declared = sorted(r.split(";")[0].strip() for r in requires if "restate" in r.split(";")[-1])
    assert sorted(restate_extra()) == declared
    assert {r.split("[")[0].split(">")[0] for r in declared} == {"restate-sdk", "hypercorn"}


def test_every_missing_piece_in_one_message_with_one_command(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_extra(monkeypatch)
    assert main(["demo", "--restate"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing started
    assert err.count("error:") == 1 and "needs 3 more piece(s)" not in err
    assert "needs 2 more piece(s)" in err  # the extra's packages, and the server
    for spec in restate_extra():
        assert spec in err
    assert "restate-server not found" in err
    command = _command(err)
    python = shlex.quote(sys.executable)
    assert command == (
        f"{python} -m pip install {' '.join(shlex.quote(s) for s in restate_extra())} && "
        f"npm install --prefix .cache/restate-server @restatedev/restate-server@{RESTATE_VERSION}"
        f" && {python} -m langgraph_deterministic demo --restate"
    )
    assert "npm is not on PATH either" in err  # PATH is empty here: said, with the way out
    assert "bash scripts/demo.sh --restate" in err


def test_only_what_is_missing_is_named(
    nowhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # this venv has the extra: only the server is missing
    assert main(["demo", "--restate"]) == 2
    err = capsys.readouterr().err
    assert "needs 1 more piece(s): (1) restate-server not found" in err
    assert "pip install" not in _command(err)


def test_with_a_server_only_the_packages_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = tmp_path / "bin" / "restate-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setenv("RESTATE_SERVER", str(server))
    _without_extra(monkeypatch)
    assert main(["demo", "--restate"]) == 2
    err = capsys.readouterr().err
    assert "needs 1 more piece(s)" in err and "restate-server" not in err.split("\n")[0][:200]
    assert "npm" not in _command(err)


def test_the_commands_pip_step_installs_into_this_interpreter(nowhere: Path) -> None:
    """The pip half of the command, run as printed: it resolves against this venv (where
    the extra is installed, so pip has nothing to fetch) and succeeds."""
    pip = [sys.executable, "-m", "pip", "install", "--no-index", *restate_extra()]
    proc = subprocess.run(pip, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
