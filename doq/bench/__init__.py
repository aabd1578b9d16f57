"""`doq bench`, the user-facing load generator (imports nothing, so building the `doq`
command line stays cheap).

- `cli`: registers `doq bench` on the `doq` command line; `args`: its arguments (no
  client imports); `grpc_load`: the load generator over gRPC (uses `doq_client` only,
  like any user), imported only when the command runs.

The benchmark harnesses and one-off measurements (doq next to RabbitMQ, the HTTP gateway,
the state machine over LMDB, backups...) are not part of the product: they live in the
checkout's `bench/` directory (bench/README.md).
"""
