"""The reference pages' generated text (docs/reference/api.md, errors.md, cli.md) is
committed so they read on GitHub as on the site; this fails when it is stale and names the
command that regenerates it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import reference


def test_the_generated_reference_text_is_current() -> None:
    late = [p.relative_to(reference.ROOT).as_posix() for p in reference.stale()]
    assert not late, f"{late} are stale: run `{reference.COMMAND}` and commit the result"


def test_check_fails_on_a_stale_page_and_names_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pages = tmp_path / "reference"
    pages.mkdir()
    for page in ("api.md", "errors.md", "cli.md"):
        text = (reference.REFERENCE / page).read_text("utf-8")
        (pages / page).write_text(text, "utf-8")
    monkeypatch.setattr(reference, "REFERENCE", pages)
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    assert reference.main(["--check"]) == 0
    cli = pages / "cli.md"
    cli.write_text(cli.read_text("utf-8").replace("## audit", "## audit (old)"), "utf-8")
    assert reference.main(["--check"]) == 1
    assert f"reference/cli.md is stale: run `{reference.COMMAND}`" in capsys.readouterr().err
    assert reference.main([]) == 0  # rewrites it
    assert reference.main(["--check"]) == 0
    assert "## audit (old)" not in cli.read_text("utf-8")


def test_every_public_name_has_a_docstring() -> None:
    import importlib
    import inspect

    missing = []
    for mod_name in reference.PUBLIC_MODULES:
        module = importlib.import_module(mod_name)
        for name in [*module.__all__, *reference.LAZY_NAMES.get(mod_name, ())]:
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
                missing.append(f"{mod_name}.{name}")
    assert not missing, missing
