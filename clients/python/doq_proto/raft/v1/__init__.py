"""Generated protobuf and gRPC code for doq.raft.v1, the internal peer transport (do not edit)."""
