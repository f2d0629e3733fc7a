"""The wheel carries what the code loads at run time (SQL files, py.typed) and nothing of
the test machinery (devtools/, tests/, the launcher that creates OS users); the sdist and
the wheel build, pass ``twine check`` and install into a fresh venv; the metadata says
what the matrix tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from langgraph_deterministic._db.migrate import discover

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    """The wheel built from the sdist (``dist`` below)."""
    (built,) = dist.glob("langgraph_deterministic-*.whl")
    return built


def test_wheel_ships_migrations_queries_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "langgraph_deterministic/py.typed" in names
    assert "langgraph_deterministic/_db/sql/queries.sql" in names
    for migration in discover():
        assert (
            f"langgraph_deterministic/migrations/{migration.version:04d}_{migration.phase}_{migration.name}.sql"
            in names
        )
    for shipped in ("demos/support_agent.py", "ops/audit.py", "ops/repair.py", "ops/sql/audit.sql", "ops/sql/repair.sql"):
        assert f"langgraph_deterministic/{shipped}" in names


# What only test machinery does: create OS users, change owners, run Postgres's own binaries.
MACHINERY = re.compile(rb"useradd|os\.chown|pg_ctl|initdb|lgd_postgres|LGD_PG_BIN|LGD_EMBEDDED_BACKEND")


def test_wheel_holds_no_test_machinery(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = {name.split("/", 1)[0] for name in names}
        assert {t for t in top if not t.endswith(".dist-info")} == {"langgraph_deterministic"}
        assert not [n for n in names if "devtools" in n or "/tests/" in n or "conftest" in n]
        offending = {
            name: sorted({m.decode() for m in MACHINERY.findall(archive.read(name))})
            for name in names
            if name.endswith((".py", ".sql", ".sh")) and MACHINERY.search(archive.read(name))
        }
    assert offending == {}
    # the launcher the tests use is where they find it, outside the package
    assert MACHINERY.search((ROOT / "devtools" / "postgres.py").read_bytes())


def test_pip_install_into_an_empty_venv_then_demo(tmp_path: Path) -> None:
    """What a new user types: install the package, run the demo (embedded Postgres).

    The package is built and installed for real (``pip install --no-deps .``: a wheel, not
    an editable install); its dependencies come from this test environment's
    site-packages through a .pth line instead of being downloaded again. Only that
    directory is added, not its .pth files, so this checkout's editable install stays out.
    """
    import os
    import sysconfig
    import venv

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONPATH")}
    where = subprocess.run(
        [str(python), "-c", "import langgraph_deterministic as m; print(m.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(purelib), where  # the installed copy, not this checkout's src/
    demo = subprocess.run(
        [str(target / "bin" / "langgraph-deterministic"), "demo"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.startswith("Scenario: ")
    assert "one user message, one refund, thread finished" in demo.stdout


def test_the_runner_imports_without_langchain_and_names_the_extra() -> None:
    """langchain is the ``agents`` extra (DurableMiddleware): without it the runner's
    star import still works, and asking for the middleware says what to install."""
    code = (
        "import sys; sys.modules['langchain'] = None\n"  # as if not installed
        "from langgraph_deterministic.runner import *\n"
        "assert 'DurableMiddleware' not in dir()\n"
        "from langgraph_deterministic import MissingExtraError\n"
        "try:\n"
        "    from langgraph_deterministic.runner import DurableMiddleware\n"
        "except ImportError as exc:  # the usual guard catches it\n"
        "    assert isinstance(exc, MissingExtraError)\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert "langgraph-deterministic[agents]" in out.stdout, out


# --- publishing: sdist + wheel, twine check, a fresh venv, the metadata ------------------

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
UV = [sys.executable, "-m", "uv"]
# uv must not download an interpreter: the venvs use this test's Python
UV_ENV = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``uv build``: the sdist, then the wheel built from the sdist (as a user's pip
    building from the sdist would)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [*UV, "build", "--quiet", "--out-dir", str(out), "--python", sys.executable, str(ROOT)],
        capture_output=True, text=True, timeout=600, env=UV_ENV, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def _metadata(wheel: Path) -> tuple[dict[str, list[str]], zipfile.ZipFile]:
    archive = zipfile.ZipFile(wheel)
    (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    message = Parser().parsestr(archive.read(name).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return fields, archive


def test_sdist_and_wheel_build_and_pass_twine_check(dist: Path) -> None:
    (sdist,) = dist.glob("langgraph_deterministic-*.tar.gz")
    (wheel,) = dist.glob("langgraph_deterministic-*.whl")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for shipped in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml",
                    "src/langgraph_deterministic/py.typed"):  # fmt: skip
        assert shipped in names, shipped
    fields, archive = _metadata(wheel)
    assert fields["License-Expression"] == ["MIT"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in archive.namelist())
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_metadata_names_the_supported_pythons_and_the_project_urls(dist: Path) -> None:
    (wheel,) = dist.glob("langgraph_deterministic-*.whl")
    fields, _ = _metadata(wheel)
    assert fields["Requires-Python"] == [">=3.11"]
    minors = sorted(
        c.rsplit(".", 1)[1] for c in fields["Classifier"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )  # fmt: skip
    assert minors == ["11", "12", "13"]  # the matrix's Pythons (3.11, 3.13) and the main one
    urls = dict(u.split(", ", 1) for u in fields["Project-URL"])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())


def test_the_wheel_installs_into_a_fresh_venv_and_runs(dist: Path, tmp_path: Path) -> None:
    """A venv with nothing in it; the wheel and its dependencies from the index (uv's
    cache); then the command and an import, from outside this checkout."""
    (wheel,) = dist.glob("langgraph_deterministic-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([*UV, "venv", "--quiet", "--python", sys.executable, str(venv)],
                   check=True, env=UV_ENV, timeout=120)  # fmt: skip
    done = subprocess.run(
        [*UV, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
        capture_output=True, text=True, env=UV_ENV, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    version = subprocess.run(
        [str(venv / "bin" / "langgraph-deterministic"), "--version"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert version.startswith(f"langgraph-deterministic {PROJECT['version']} (langgraph 1.2."), version
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import langgraph_deterministic as m; from langgraph_deterministic import "
         "DeterministicSaver, run_config; print(m.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    assert imported.startswith(str(venv)), imported  # the installed copy, not src/


def test_version_flag_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph_deterministic.cli import main

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"langgraph-deterministic \S+ \(langgraph \S+, Python \d+\.\d+\.\d+\)\n", out
    ), out


def _floors() -> dict[str, str]:
    """Each requirement's floor in pyproject.toml (dependencies and the restate, temporal
    and celery extras)."""
    floors = {}
    extras = PROJECT["optional-dependencies"]
    for requirement in [
        *PROJECT["dependencies"], *extras["restate"], *extras["temporal"], *extras["celery"]
    ]:  # fmt: skip
        found = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9.]+)", requirement)
        assert found, requirement
        floors[found.group(1)] = found.group(2)
    return floors


def test_the_matrix_lowest_pins_are_pyprojects_floors() -> None:
    """scripts/matrix.py's lowest combination installs exactly the floors we declare."""
    pins = dict(
        line.split("==")
        for line in (ROOT / "scripts" / "matrix-lowest.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for dist, floor in _floors().items():
        if dist in ("rich", "hypercorn"):  # no behaviour of theirs is version-sensitive here
            continue
        pinned = pins[dist]
        # a floor of "4.3" is the release 4.3.0
        assert pinned.split(".") == (floor.split(".") + ["0"] * 3)[: len(pinned.split("."))], (
            dist, floor, pinned,
        )  # fmt: skip
    assert pins["psycopg-binary"] == pins["psycopg"]  # the [binary] extra's own pin
