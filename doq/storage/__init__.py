"""LMDB storage: one environment per node holding the Raft log and the queue state."""
