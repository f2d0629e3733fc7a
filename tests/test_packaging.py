"""The wheel carries what the code loads at run time: SQL files and py.typed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from langgraph_deterministic.checkpointer._migrate import discover

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_migrations_queries_and_py_typed(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("langgraph_deterministic-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "langgraph_deterministic/py.typed" in names
    assert "langgraph_deterministic/checkpointer/sql/queries.sql" in names
    for migration in discover():
        assert (
            f"langgraph_deterministic/migrations/{migration.version:04d}_{migration.phase}_{migration.name}.sql"
            in names
        )
