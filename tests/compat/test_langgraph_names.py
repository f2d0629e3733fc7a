"""Every private LangGraph / langchain-core name we rely on (``_compat/langgraph.py``).

These fail loudly when a LangGraph upgrade moves or renames one: the import of the
package itself raises IncompatibleLangGraphError naming the supported versions, and
the names whose *values* are stored or read by our SQL are pinned here.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from langgraph_deterministic._compat import langgraph as compat
from langgraph_deterministic.errors import DeterministicError, IncompatibleLangGraphError

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_range(dist: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for deps in project["optional-dependencies"].values() for r in deps]
    for requirement in [*project["dependencies"], *extras]:
        name, _, spec = requirement.partition(">")
        if name.split("[")[0] == dist:
            return ">" + spec
    raise AssertionError(f"{dist} is not in pyproject.toml")


def test_supported_range_is_pyprojects() -> None:
    assert compat.SUPPORTED_LANGGRAPH == _pyproject_range("langgraph") == ">=1.2.18,<1.3"


def _assert_fix_excludes_installed(message: str, dist: str, version: str | None = None) -> None:
    """The command the message names would change what is installed: its requirement
    excludes the installed version (a fix that names a range the installed version is in
    changes nothing)."""
    from packaging.requirements import Requirement

    found = re.search(r"Fix: pip install '([^']+)'", message)
    assert found, message
    requirement = Requirement(found.group(1))
    assert requirement.name == dist, message
    current = version or importlib.metadata.version(dist)
    assert not requirement.specifier.contains(current, prereleases=True), message


@pytest.mark.parametrize("version", ["1.2.0", "1.2.12", "1.2.17", "1.1.10", "1.0.10", "1.3.0"])
def test_the_fix_excludes_an_unsupported_version(version: str) -> None:
    """The versions the matrix found broken (1.2.0-1.2.17), older ones, and a future
    1.3: the message's pin leaves each out."""
    from langgraph_deterministic import _compat

    message = _compat.incompatible_message(
        "langgraph", "lacks a name", compat.SUPPORTED_LANGGRAPH, user="x"
    )
    assert "langgraph>=1.2.18,<1.3" in message
    fix = _compat.fix_range(compat.SUPPORTED_LANGGRAPH, version)
    _assert_fix_excludes_installed(f"Fix: pip install 'langgraph{fix}'", "langgraph", version)


def test_the_fix_excludes_a_supported_version_that_broke(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release inside the supported range that moved a name (untested when this
    package was released): the fix pins it out instead of naming a range it is in."""
    from langgraph_deterministic import _compat

    inside = "1.2.30"  # a release the range admits, untested when this package was released
    monkeypatch.setattr(_compat, "installed", lambda dist: inside)
    message = _compat.incompatible_message(
        "langgraph", "lacks a name", compat.SUPPORTED_LANGGRAPH, user="x"
    )
    assert f"!={inside}" in message
    _assert_fix_excludes_installed(message, "langgraph", inside)


def test_every_exported_name_resolves() -> None:
    for name in compat.__all__:
        assert getattr(compat, name) is not None, name


def test_values_our_sql_and_stored_rows_depend_on() -> None:
    # queries.sql, the migrations and ops/sql/audit.sql read these channel names out of
    # LangGraph's checkpoint JSON: a rename would need new SQL, not just a new import.
    assert compat.TASKS == "__pregel_tasks"
    assert compat.INTERRUPT == "__interrupt__"
    assert compat.NULL_TASK_ID == "00000000-0000-0000-0000-000000000000"
    assert compat.NS_SEP == "|"
    # Channels repair reads and closes in stored checkpoints (ops/repair.py).
    assert compat.START == "__start__"
    assert compat.branch_to() == "branch:to:"
    # Keys of the config LangGraph hands its saver and its runner.
    assert compat.CONFIG_KEY_RUNTIME == "__pregel_runtime"
    assert compat.CONFIG_KEY_RUNNER_SUBMIT == "__pregel_runner_submit"
    assert (compat.PUSH, compat.PULL) == ("__pregel_push", "__pregel_pull")


def test_runner_hooks_are_present() -> None:
    compat.check_runner_hooks.cache_clear()
    compat.check_runner_hooks()


def _refused_hooks(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, value: Any) -> str:
    monkeypatch.setattr(target, name, value)
    compat.check_runner_hooks.cache_clear()
    try:
        with pytest.raises(IncompatibleLangGraphError) as info:
            compat.check_runner_hooks()
    finally:
        monkeypatch.undo()
        compat.check_runner_hooks.cache_clear()
    message = str(info.value)
    assert "pip install" in message
    _assert_fix_excludes_installed(message, "langgraph")
    assert isinstance(info.value, DeterministicError)
    return message


def test_a_pregel_that_ignores_the_submit_hook_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph.pregel.main import Pregel

    async def astream(self: Any, *args: Any, **kwargs: Any) -> Any:  # reads no submit key
        yield None

    message = _refused_hooks(monkeypatch, Pregel, "astream", astream)
    assert "submit function" in message


def test_an_executor_without_the_submit_keywords_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from langgraph.pregel._executor import AsyncBackgroundExecutor

    def submit(self: Any, fn: Any, *args: Any, __name__: str | None = None, **kw: Any) -> Any:
        raise AssertionError("not called")

    message = _refused_hooks(monkeypatch, AsyncBackgroundExecutor, "submit", submit)
    assert "__reraise_on_exit__" in message


def test_the_runner_hook_check_reads_no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect.getsource cost ~9 ms per DeterministicRunner(); the check is structural
    now and runs once per process."""
    from langgraph_deterministic.runner._runner import check_langgraph

    def no_source(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the runner check read source text")

    monkeypatch.setattr(inspect, "getsource", no_source)
    monkeypatch.setattr(inspect, "getsourcelines", no_source)
    check_langgraph.cache_clear()
    compat.check_runner_hooks.cache_clear()
    check_langgraph()
    hits = check_langgraph.cache_info().hits
    check_langgraph()  # what every further DeterministicRunner() costs: a cache hit
    assert check_langgraph.cache_info().hits == hits + 1


def _import_with(setup: str) -> subprocess.CompletedProcess[str]:
    # LangGraph's own modules import these names too: load them first, then take the
    # name away, as an upgrade that moved it would look to our import.
    code = f"import langgraph.graph, langgraph.checkpoint.base\n{setup}\nimport langgraph_deterministic\n"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


@pytest.mark.parametrize(
    ("setup", "named"),
    [
        (
            "import langgraph._internal._constants as c; del c.CONFIG_KEY_RUNTIME",
            "CONFIG_KEY_RUNTIME",
        ),
        ("import langgraph.checkpoint.serde.types as t; del t._DeltaSnapshot", "_DeltaSnapshot"),
        (
            "import langchain_core.runnables.config as c; del c.var_child_runnable_config",
            "var_child_runnable_config",
        ),
        ("import langgraph.checkpoint.serde.types as t; t.TASKS = '__tasks'", "__tasks"),
    ],
)
def test_a_moved_name_fails_the_import_loudly(setup: str, named: str) -> None:
    done = _import_with(setup)
    assert done.returncode != 0, done.stdout
    assert "IncompatibleLangGraphError" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr
    _assert_fix_excludes_installed(done.stderr.strip().splitlines()[-1], "langgraph")
