"""``python -m langgraph_deterministic ...``: the ``langgraph-deterministic`` command."""

import sys

from langgraph_deterministic.cli import main

sys.exit(main())
