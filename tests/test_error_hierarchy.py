"""Every exception class this package defines derives from DeterministicError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import langgraph_deterministic
from langgraph_deterministic import DeterministicError


def test_every_exception_we_define_derives_from_the_base_class() -> None:
    found = []
    for module_info in pkgutil.walk_packages(
        langgraph_deterministic.__path__, prefix="langgraph_deterministic."
    ):
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith(
                "langgraph_deterministic"
            ):
                found.append(cls)
                assert issubclass(cls, DeterministicError), cls
    assert len(set(found)) >= 12  # the walk really reached the modules


def test_every_public_error_is_exported_at_the_top_level() -> None:
    from langgraph_deterministic import errors

    for name in errors.__all__:
        assert getattr(langgraph_deterministic, name) is getattr(errors, name)
