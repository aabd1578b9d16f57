"""doq's load generators and benchmarks, all in one place (imports nothing, so building
the `doq` command line stays cheap).

- `cli`: the `doq bench` arguments (no client imports); `grpc_load`: the `doq bench` load
  generator over gRPC (uses `doq_client` only, like any user).
- `side_by_side`: doq next to RabbitMQ's quorum queue through the same user-style
  clients (`python bench/side_by_side.py`).
- `http_load`: HTTP gateway load (`python bench/http_bench.py`).
- `apply`, `restart`, `index_memory`: the state machine over LMDB (apply throughput,
  restart time with 1M messages, index bytes per message).
- `backup`: backup file throughput (format only, or a real StateStore with `--lmdb`).

Each module runs with `python -m doq.bench.<name>`; bench/ holds thin scripts that call
them from a checkout, and the figures they produced. Tests never assert on their speed.
"""
