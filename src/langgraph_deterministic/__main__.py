"""``python -m langgraph_deterministic ...``: the ``langgraph-deterministic`` command."""

import sys

from langgraph_deterministic.cli import main

if __name__ == "__main__":  # (importing it, as a walk of the package does, runs nothing)
    sys.exit(main())
