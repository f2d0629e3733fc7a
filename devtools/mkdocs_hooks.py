"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``): checks that make
``mkdocs build --strict`` fail on a gap. The build imports nothing of the package: the
reference pages' generated text is committed (``python -m devtools.reference`` writes it,
tests/test_reference_pages.py checks it is current), so ``pip install -e '.[docs]'`` is all
the build needs.

* A reference page whose generated section is empty (its markers with nothing between)
  is a warning: run ``python -m devtools.reference``.
* A link from a page to a repository file outside ``docs/`` (``../../examples/x.py``) must
  name a file that exists; on the site it becomes a link into the repository when
  ``repo_url`` is set, else the file's path as code.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.lgd")

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
_EMPTY = re.compile(r"<!-- lgd:(\w+):start -->\s*<!-- lgd:\1:end -->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name in _EMPTY.findall(markdown):
        log.warning("%s: section %r is empty: run `python -m devtools.reference`",
                    page.file.src_path, name)  # fmt: skip
    return _outside_links(markdown, page, config)


# -- links to repository files -----------------------------------------------------------


def _outside_links(markdown: str, page: Any, config: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    src = (docs_dir / page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def fix(m: re.Match[str]) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
            return m.group(0)
        path = (src / target).resolve()
        if path.is_relative_to(docs_dir):
            return m.group(0)  # mkdocs checks these itself
        if not path.is_relative_to(ROOT) or not path.exists():
            log.warning("%s: link to %s, which does not exist", page.file.src_path, target)
            return m.group(0)
        rel = path.relative_to(ROOT).as_posix()
        if repo_url:
            kind = "tree" if path.is_dir() else "blob"
            return f"[{text}]({repo_url}/{kind}/main/{rel}{anchor})"
        return text if f"`{rel}`" == text or rel in text else f"{text} (`{rel}`)"

    # leave fenced code blocks alone
    parts = re.split(r"(^```.*?^```)", markdown, flags=re.M | re.S)
    return "".join(p if p.startswith("```") else _LINK.sub(fix, p) for p in parts)
