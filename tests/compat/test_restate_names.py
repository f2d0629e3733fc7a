"""Every restate-sdk name RestateJournal relies on (``_compat/restate.py``): checked once,
when the restate extra is used; an upgrade that moves one fails here, loudly."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from tests.compat.test_langgraph_names import _pyproject_range

pytest.importorskip("restate", reason="restate-sdk (the restate extra) is not installed")

from langgraph_deterministic._compat import restate as compat
from langgraph_deterministic.errors import IncompatibleRestateError

ROOT = Path(__file__).resolve().parents[2]


def test_supported_range_is_pyprojects() -> None:
    from langgraph_deterministic.runner._restate import SUPPORTED_RESTATE

    assert compat.SUPPORTED_RESTATE == SUPPORTED_RESTATE == _pyproject_range("restate-sdk")


def test_every_exported_name_resolves() -> None:
    for name in compat.__all__:
        assert getattr(compat, name) is not None, name


def test_the_package_does_not_import_restate() -> None:
    code = "import sys, langgraph_deterministic; assert 'restate' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_a_context_without_the_attributes_we_use_is_refused() -> None:
    with pytest.raises(IncompatibleRestateError, match=r"restate-sdk>=1\.3,<1\.4.*pip install") as info:
        compat.check_context(object())
    # the installed restate-sdk is inside the range: the fix pins it out
    fix = re.search(r"Fix: pip install '([^']+)'", str(info.value))
    assert fix is not None
    requirement = Requirement(fix.group(1))
    assert requirement.name == "restate-sdk"
    assert not requirement.specifier.contains(importlib.metadata.version("restate-sdk"))


@pytest.mark.parametrize(
    ("setup", "named"),
    [
        ("import restate.server_context as s; del s._restate_context_var", "_restate_context_var"),
        ("import restate.vm as v; del v.DoProgressExecuteRun", "DoProgressExecuteRun"),
        (
            "import restate.server_context as s; "
            "del s.ServerInvocationContext.create_poll_or_cancel_coroutine",
            "create_poll_or_cancel_coroutine",
        ),
        ("import restate.vm as v; del v.VMWrapper.do_progress", "do_progress"),
    ],
)
def test_a_moved_name_fails_loudly(setup: str, named: str) -> None:
    code = f"{setup}\nimport langgraph_deterministic._compat.restate\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode != 0, done.stdout
    assert "IncompatibleRestateError" in done.stderr, done.stderr
    assert named in done.stderr and "restate-sdk>=1.3,<1.4" in done.stderr, done.stderr
