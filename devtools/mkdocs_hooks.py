"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``): reference pages rendered from the
code so they cannot drift, and checks that make ``mkdocs build --strict`` fail on a gap.

* ``<!-- lgd:errors -->`` becomes a table of every :class:`DeterministicError` subclass:
  its cause and fix (from its docstring) and whether a retry can succeed (``retryable``).
  A class whose docstring names no ``Fix:`` is a warning.
* ``<!-- lgd:cli -->`` becomes the reference of every ``langgraph-deterministic`` command
  and option, read from the argparse parser ``cli.main`` builds. An option with no help
  text is a warning.
* Every ``::: module.Name`` of a page must have a docstring, and so must each public
  member mkdocstrings renders for it (what ``show_if_no_docstring`` would hide silently).
* A link from a page to a repository file outside ``docs/`` (``../../examples/x.py``) must
  name a file that exists; on the site it becomes a link into the repository when
  ``repo_url`` is set, else the file's path as code.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.lgd")

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- lgd:errors -->" in markdown:
        markdown = markdown.replace("<!-- lgd:errors -->", errors_table())
    if "<!-- lgd:cli -->" in markdown:
        markdown = markdown.replace("<!-- lgd:cli -->", cli_reference())
    for ident in re.findall(r"^::: ([\w.]+)", markdown, flags=re.M):
        _check_docstrings(ident)
    return _outside_links(markdown, page, config)


# -- errors ------------------------------------------------------------------------------


def error_classes() -> list[type]:
    """Every error class of langgraph_deterministic.errors, the base first."""
    from langgraph_deterministic import errors

    found = [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.DeterministicError) and obj.__module__ == errors.__name__
    ]
    return sorted(found, key=lambda c: (c is not errors.DeterministicError, c.__name__))


def _cause_and_fix(cls: type) -> tuple[str, str]:
    doc = " ".join((inspect.getdoc(cls) or "").split())
    cause, sep, fix = doc.partition("Fix:")
    return cause.strip(), fix.strip() if sep else ""


def errors_table() -> str:
    out = []
    for cls in error_classes():
        cause, fix = _cause_and_fix(cls)
        if not fix and cls.__name__ != "DeterministicError":
            log.warning("errors.%s: its docstring names no 'Fix:'", cls.__name__)
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        retry = "yes" if getattr(cls, "retryable", False) else "no"
        out.append(f"### {cls.__name__}\n\n*Derives from* {bases}. "
                   f"*Retryable:* **{retry}**.\n\n{_rst(cause)}\n")  # fmt: skip
        if fix:
            out.append(f"**Fix:** {_rst(fix)}\n")
    return "\n".join(out)


def _rst(text: str) -> str:
    """Docstring markup to Markdown: ``code`` and :class:`Name` become `code`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# -- CLI ---------------------------------------------------------------------------------

_SHARED_HELP = {"--dsn": "Postgres connection string (default: `$DATABASE_URL`)."}


class _Captured(Exception):
    pass


def cli_parser() -> argparse.ArgumentParser:
    """The parser ``langgraph_deterministic.cli.main`` builds, caught at ``parse_args``."""
    from langgraph_deterministic import cli

    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        cli.main([])
    except _Captured as got:
        parser: argparse.ArgumentParser = got.args[0]
        return parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise RuntimeError("cli.main returned without parsing its arguments")


def cli_commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_reference() -> str:
    parser = cli_parser()
    out = [f"```text\n{parser.format_usage().strip()}\n```\n"]
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
    for name, sub in cli_commands().items():
        out.append(f"## {name}\n")
        summary = sub.description or helps.get(name) or ""
        if not summary:
            log.warning("cli: command %r has no help or description", name)
        out.append(f"{_rst(' '.join(summary.split()))}\n")
        usage = sub.format_usage().strip().removeprefix("usage: ")
        out.append(f"```text\n{usage}\n```\n")
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
            text = action.help or _SHARED_HELP.get(action.option_strings[0] if action.option_strings else "")
            if not text:
                log.warning("cli: %s %s has no help text", name, flags)
                text = ""
            extra = []
            if action.choices:
                extra.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
            if (action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0
                    and "default" not in text):  # fmt: skip
                extra.append(f"default `{action.default}`")
            text = " ".join(text.split()).replace("%(default)s", str(action.default))
            cell = text + (f" ({'; '.join(extra)})" if extra else "")
            rows.append(f"| {flags} | {cell.replace('|', '&#124;')} |")
        if rows:
            out.append("| option | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


# -- docstrings --------------------------------------------------------------------------


def _check_docstrings(ident: str) -> None:
    import importlib

    module_name, _, attr = ident.rpartition(".")
    try:
        obj: Any = importlib.import_module(ident)
        attr = ""
    except ImportError:
        obj = getattr(importlib.import_module(module_name), attr)
    if not inspect.getdoc(obj):
        log.warning("%s has no docstring", ident)
    if inspect.ismodule(obj):
        names = getattr(obj, "__all__", None) or [n for n in vars(obj) if not n.startswith("_")]
        members = [(n, getattr(obj, n)) for n in names]
        members = [(n, m) for n, m in members if getattr(m, "__module__", None) == obj.__name__]
    elif inspect.isclass(obj):
        members = [(n, m) for n, m in vars(obj).items() if not n.startswith("_")]
    else:
        members = []
    for name, member in members:
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if not (inspect.isfunction(member) or inspect.isclass(member) or isinstance(member, property)):
            continue
        if not (inspect.getdoc(getattr(obj, name, member)) or "").strip():  # inherited too
            log.warning("%s.%s has no docstring", ident, name)


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
