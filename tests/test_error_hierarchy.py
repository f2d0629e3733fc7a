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


def test_retryable_classification() -> None:
    """Transient errors are retryable, permanent ones are not; other exceptions are not ours."""
    import langgraph_deterministic as lgd

    transient = {
        lgd.DatabaseUnavailableError,
        lgd.ConcurrentRunError,
        lgd.ThreadBusyError,
        lgd.MigrationError,
        lgd.MigrationLockTimeoutError,
    }
    for name in lgd.__all__:
        cls = getattr(lgd, name)
        if isinstance(cls, type) and issubclass(cls, lgd.DeterministicError):
            assert lgd.is_retryable(cls("x")) is (cls in transient), name
    assert lgd.is_retryable(RuntimeError("boom")) is False
    assert lgd.is_retryable(ConnectionError("not ours")) is False
