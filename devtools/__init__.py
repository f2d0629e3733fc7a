"""Development tooling shared by tests/, benchmarks/ and scripts/: never shipped in the wheel.

The editable install (``pip install -e .``, which scripts/_venv.sh runs) puts the repository
root on ``sys.path`` (``dev-mode-dirs`` in pyproject.toml), so ``import devtools`` works from
tests, benchmarks and subprocesses alike; the wheel holds only ``langgraph_deterministic``.
"""
