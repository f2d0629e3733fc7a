"""The wheel carries what the code loads at run time (SQL files, py.typed) and nothing of
the test machinery (devtools/, tests/, the launcher that creates OS users)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from langgraph_deterministic.checkpointer._migrate import discover

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("langgraph_deterministic-*.whl")
    return built


def test_wheel_ships_migrations_queries_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "langgraph_deterministic/py.typed" in names
    assert "langgraph_deterministic/checkpointer/sql/queries.sql" in names
    for migration in discover():
        assert (
            f"langgraph_deterministic/migrations/{migration.version:04d}_{migration.phase}_{migration.name}.sql"
            in names
        )
    for shipped in ("demo.py", "ops/audit.py", "ops/repair.py", "ops/sql/audit.sql", "ops/sql/repair.sql"):
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
