"""The documentation site builds in strict mode (a broken link or an empty generated
section fails it: devtools/mkdocs_hooks.py), and its reference pages cover what the code
and the database hold (the generated text: devtools/reference.py)."""

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

from devtools import reference
from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as README says to build it: a fresh venv, ``pip install -e '.[docs]'``
    (uv's pip, from its cache: seconds), ``mkdocs build --strict``, outside this test's
    environment (no PYTHONPATH), so the build can need nothing the docs extra lacks."""
    venv = tmp_path_factory.mktemp("docs-venv")
    out = tmp_path_factory.mktemp("site")
    uv = [sys.executable, "-m", "uv"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(UV_PYTHON_DOWNLOADS="never", NO_MKDOCS_2_WARNING="1")
    subprocess.run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                   check=True, env=env, timeout=120)  # fmt: skip
    done = subprocess.run(
        [*uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
         "-e", f"{ROOT}[docs]"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [str(venv / "bin" / "mkdocs"), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
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
    for cls in reference.error_classes():
        assert cls.__name__ in text, cls
        retry = "yes" if cls.retryable else "no"
        section = text.split(cls.__name__ + " ¶", 1)[-1][:2000]
        assert f"Retryable: {retry}" in " ".join(section.split()), (cls, section[:300])
        if cls.__name__ != "DeterministicError":
            assert "Fix:" in section, cls


def test_cli_page_lists_every_command_and_option(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    for name, parser in reference.cli_commands().items():
        assert f"{name} ¶" in text, name
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in text, (name, flag)


def test_api_page_renders_every_public_name(site: Path) -> None:
    """Every name of every public module's ``__all__`` is on the built API page (an error
    class on the errors page), and every module without a leading underscore is either
    public or named internal with its reason."""
    import importlib
    import pkgutil

    import langgraph_deterministic

    text = _text(site / "reference" / "api" / "index.html")
    errors_text = _text(site / "reference" / "errors" / "index.html")
    errors = {c.__name__ for c in reference.error_classes()}
    for mod_name in reference.PUBLIC_MODULES:
        assert f"{mod_name} ¶" in text, mod_name
        module = importlib.import_module(mod_name)
        for name in [*module.__all__, *reference.LAZY_NAMES.get(mod_name, ())]:
            if name in errors:
                assert f"{name} ¶" in errors_text, (mod_name, name)
            else:
                assert re.search(rf"\b{re.escape(name)}\b", text), (mod_name, name)
    for info in pkgutil.walk_packages(langgraph_deterministic.__path__, "langgraph_deterministic."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        assert info.name in reference.PUBLIC_MODULES or info.name in reference.INTERNAL_MODULES, (
            f"{info.name}: add it to devtools/reference.py's PUBLIC_MODULES or INTERNAL_MODULES"
        )
    roles = re.findall(r":(?:class|meth|func|attr|data|mod|exc|obj):\S*", text)
    assert not roles, roles  # docstrings' Sphinx roles render as plain code


def test_api_page_shows_constructors_and_no_private_bases(site: Path) -> None:
    text = "".join(_text(site / "reference" / "api" / "index.html").split())  # no spaces:
    # the highlighter splits a signature into tokens
    for param in ("lease_ttl: float = 30.0", "buffer_writes: float = 0.05",
                  "pool_max_size: int | None = None", "run_id_policy: RunIdPolicy = 'require'",
                  "class DeterministicSaver(", "def call_with_retries(", "class WorkerLocal("):
        assert "".join(param.split()) in text, param  # fmt: skip
    assert "DerivesfromBaseCheckpointSaver[str]" in text
    for private in ("Lifecycle", "Connections", "lease_ttl = float(lease_ttl)"):
        assert "".join(private.split()) not in text, private


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
