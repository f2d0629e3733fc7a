"""The documentation site builds in strict mode (a broken link, a missing docstring, an
error without a fix or a CLI option without help fails it: devtools/mkdocs_hooks.py), and
its reference pages cover what the code and the database hold."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from devtools import mkdocs_hooks
from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text("utf-8")))


def test_every_page_is_in_the_nav_and_built(site: Path) -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).as_posix()
        assert rel in nav, f"{rel} is not in mkdocs.yml's nav"
        built = site / ("index.html" if rel == "index.md" else rel.removesuffix(".md") + "/index.html")
        assert built.exists(), built


def test_errors_page_lists_every_error_with_its_fix(site: Path) -> None:
    text = _text(site / "reference" / "errors" / "index.html")
    for cls in mkdocs_hooks.error_classes():
        assert cls.__name__ in text, cls
        retry = "yes" if cls.retryable else "no"
        section = text.split(cls.__name__ + " ¶", 1)[-1][:2000]
        assert f"Retryable: {retry}" in " ".join(section.split()), (cls, section[:300])
        if cls.__name__ != "DeterministicError":
            assert "Fix:" in section, cls


def test_cli_page_lists_every_command_and_option(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    for name, parser in mkdocs_hooks.cli_commands().items():
        assert f"{name} ¶" in text, name
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in text, (name, flag)


def test_api_page_renders_every_public_name(site: Path) -> None:
    import langgraph_deterministic

    text = _text(site / "reference" / "api" / "index.html")
    errors = {c.__name__ for c in mkdocs_hooks.error_classes()}
    for name in langgraph_deterministic.__all__:
        if name in errors:  # the errors page has them
            continue
        assert name in text, name
    for name in ("RestateJournal", "DurableMiddleware", "ConnectionPool", "AsyncConnectionPool"):
        assert name in text, name


def test_internal_sql_names_stay_in_the_reference_and_architecture() -> None:
    allowed = {"explanation/architecture.md"}
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).as_posix()
        if rel.startswith("reference/") or rel in allowed:
            continue
        names = re.findall(r"\blgd_\w+", page.read_text("utf-8"))
        assert not names, (rel, names)


@pytest.fixture
def fresh(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_docs_schema")
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def test_schema_page_names_every_table_and_function(fresh: str) -> None:
    with DeterministicSaver(fresh) as saver:
        saver.setup()
    with psycopg.connect(fresh, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'S')"
            " UNION SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'public'"
        ).fetchall()]  # fmt: skip
    page = (DOCS / "reference" / "schema.md").read_text("utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"docs/reference/schema.md does not describe {missing}"
