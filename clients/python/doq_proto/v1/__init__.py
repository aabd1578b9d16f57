"""Generated protobuf and gRPC code for doq.v1 (do not edit)."""
