"""The named SQL of the saver: the blocks of ``sql/queries.sql``."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def queries() -> dict[str, str]:
    """The named blocks of ``sql/queries.sql`` (``-- name: key``)."""
    return named_blocks(resources.files(__package__).joinpath("sql/queries.sql").read_text("utf-8"))


def named_blocks(text: str) -> dict[str, str]:
    """The ``-- name: key`` blocks of a SQL file, without their comment lines."""
    blocks: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name:
                blocks[name] = "\n".join(lines).strip()
            name, lines = line.split(":", 1)[1].strip(), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    if name:
        blocks[name] = "\n".join(lines).strip()
    return blocks
