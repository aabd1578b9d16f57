"""Generated protobuf and gRPC code of doq (do not edit; see proto/generate.py)."""
