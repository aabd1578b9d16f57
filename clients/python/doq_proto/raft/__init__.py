"""Generated code for doq.raft.* (do not edit)."""
