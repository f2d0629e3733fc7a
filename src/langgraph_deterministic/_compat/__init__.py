"""Every private name of LangGraph, langchain-core and restate-sdk this package relies on.

One module per library: ``langgraph`` (imported with the package) and ``restate`` (only
when the restate extra is used). Each checks its names once, at import, and raises
``IncompatibleLangGraphError`` / ``IncompatibleRestateError`` naming the supported
versions. ``tests/compat`` fails loudly when an upgrade moves one of them.
"""

from __future__ import annotations

import importlib.metadata
import re
from functools import cache

_OURS = "langgraph-deterministic"


@cache
def supported(dist: str, fallback: str) -> str:
    """The version range of ``dist`` our installed metadata (from pyproject) requires."""
    try:
        requires = importlib.metadata.requires(_OURS) or []
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a tree
        return fallback
    for requirement in requires:
        found = re.match(rf"{re.escape(dist)}(\[[^\]]*\])?\s*([<>=!~][^;]*)", requirement)
        if found:
            parts = found.group(2).replace(" ", "").split(",")
            return ",".join(sorted(parts, key=lambda p: (not p.startswith(">"), p)))
    return fallback  # pragma: no cover - pyproject names every library we check


def incompatible_message(
    dist: str, what: str, supported_range: str, *, user: str, beside: tuple[str, ...] = ()
) -> str:
    """Why an installed library cannot serve ``user``, the range we support, and the fix:
    a requirement that excludes the installed version (``fix_range``)."""
    version = installed(dist)
    also = ", ".join(f"{d} {installed(d)}" for d in beside)
    return (
        f"{dist} {version}{f' ({also})' if also else ''} {what}, which {user} relies "
        f"on; langgraph-deterministic supports {dist}{supported_range}. "
        f"Fix: pip install '{dist}{fix_range(supported_range, version)}'."
    )


def fix_range(supported_range: str, version: str) -> str:
    """``supported_range``, narrowed to exclude ``version`` when it lies inside it (a
    release of the library we have not tested that broke a name): the command the
    message names must change what is installed."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - langchain-core depends on packaging
        return supported_range
    try:
        inside = Version(version) in SpecifierSet(supported_range)
    except (InvalidSpecifier, InvalidVersion):  # "not installed", a local build
        return supported_range
    return f"{supported_range},!={version}" if inside else supported_range


def installed(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
