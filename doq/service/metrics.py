"""Prometheus metrics of a node (exposed by the HTTP gateway at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

COMMIT_SECONDS = Histogram(
    "doq_commit_seconds",
    "Time to apply and durably commit one log batch",
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)
FSYNC_SECONDS = Histogram(
    "doq_fsync_seconds",
    "Time of the LMDB commit (fsync) of one batch",
    buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
)
COMMANDS = Counter("doq_commands_applied_total", "Commands applied by this node")
BATCHES = Counter("doq_batches_committed_total", "Log batches committed by this node")


def observe_commit(commands: int, commit_seconds: float, fsync_seconds: float) -> None:
    """Called by the node after each committed batch."""
    COMMIT_SECONDS.observe(commit_seconds)
    FSYNC_SECONDS.observe(fsync_seconds)
    COMMANDS.inc(commands)
    BATCHES.inc()
