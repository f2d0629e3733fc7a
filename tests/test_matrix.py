"""scripts/matrix.py installs into the venvs it makes, never into the one that runs it.

uv's ``python -m uv`` wrapper tells uv which interpreter spawned it, and uv then installs
into that interpreter's environment whatever ``VIRTUAL_ENV`` says: the matrix's "lowest"
install once downgraded the venv running CI and left its own venv empty. These tests run
the matrix's own install step (a real uv, a real venv) with no uv on PATH, as on a fresh
machine.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lgd_matrix", ROOT / "scripts" / "matrix.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_uv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH without any uv, and VIRTUAL_ENV naming the venv that runs the tests."""
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "uv").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)


def test_the_uv_it_runs_is_the_binary_not_this_interpreter(matrix: ModuleType, no_uv_on_path: None) -> None:
    found = Path(matrix.uv())
    assert found.name == "uv" and found.is_file()
    assert matrix._uv_env().get("VIRTUAL_ENV") is None


def test_an_install_lands_in_the_target_venv_only(
    matrix: ModuleType, no_uv_on_path: None, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    env = matrix._uv_env()
    subprocess.run([matrix.uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
                   check=True, env=env)  # fmt: skip
    before = matrix.versions(sys.executable)
    # A small, dependency-free package stands for the test extra: what matters is where it lands.
    subprocess.run([matrix.uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                    "iniconfig"], check=True, env=env)  # fmt: skip
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import iniconfig; print(iniconfig.__file__)"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert found.startswith(str(venv))
    assert matrix.versions(sys.executable) == before


def test_an_empty_venv_is_refused_before_any_test_runs(
    matrix: ModuleType, no_uv_on_path: None, tmp_path: Path
) -> None:
    combo = matrix.Combination("lowest-check", f"{sys.version_info[0]}.{sys.version_info[1]}", "lowest", "14")
    venv = tmp_path / "venv"
    subprocess.run([matrix.uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
                   check=True, env=matrix._uv_env())  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        matrix.check_installed(combo, venv / "bin" / "python")
    message = str(refused.value)
    assert "langgraph is not installed" in message and "celery is not installed" in message
    assert "Fix: delete" in message


def test_versions_off_the_pins_are_named(matrix: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    combo = matrix.Combination("lowest-check", f"{sys.version_info[0]}.{sys.version_info[1]}", "lowest", "14")
    with pytest.raises(SystemExit) as refused:
        matrix.check_installed(combo, Path(sys.executable))  # this venv holds the newest versions
    pins = matrix.lowest_pins()
    assert f"where scripts/matrix-lowest.txt pins {pins['langgraph']}" in str(refused.value)
