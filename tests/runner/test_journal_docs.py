"""The complete example of docs/how-to/durable-ops-without-restate.md runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "durable-ops-without-restate.md"


def test_the_complete_example_charges_once(dsn: str, tmp_path: Path) -> None:
    text = DOC.read_text("utf-8")
    section = text[text.index("## A complete example") :]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    script = tmp_path / "example.py"
    script.write_text(code)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("receipt-")
