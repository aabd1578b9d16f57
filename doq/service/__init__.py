"""Service layer: one facade (api.py) with thin gRPC and HTTP adapters."""
