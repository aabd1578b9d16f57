"""doq: a durable, replicated queue service (delayed and fair queues over Raft and LMDB)."""

__version__ = "0.1.0"  # the one source of the version (pyproject.toml reads it)
