"""Deterministic superstep execution (see docs/deterministic-replay-on-restate.md)."""
