"""`doq bench` arguments, apart from the load generator (`grpc_load`, which parses them
too) and from the command's registration (`cli`): building the `doq` command line
imports no client stack."""

from __future__ import annotations

import argparse

WORKLOADS = ("enqueue", "dequeue", "mixed", "echo")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from doq.client_cli import add_json_argument, add_server_argument

    p.add_argument("--workload", choices=WORKLOADS, default="enqueue", help="what to run")
    p.add_argument("--frames", choices=("single", "batched"), default="single",
                   help="one message per stream frame, or --batch per frame")
    p.add_argument("--batch", type=int, default=100, help="messages per frame with --frames batched")
    add_server_argument(p, "node (its gRPC address is asked from it), or grpc://HOST:PORT")
    p.add_argument("--queue", default="bench", help="queue to use (created if missing)")
    p.add_argument("--concurrency", type=int, default=1, help="producer/consumer streams")
    p.add_argument("--payload-bytes", type=int, default=100, help="message content size")
    p.add_argument("--count", type=int, default=0, help="messages per run (0: 10000 unless --duration-s)")
    p.add_argument("--duration-s", type=float, default=0.0, help="run length (with or without --count)")
    p.add_argument("--rate", type=float, default=0.0, help="target msg/s in total (0 = as fast as possible)")
    p.add_argument("--window", type=int, default=0, help="unacked messages per producer stream")
    p.add_argument("--prefetch", type=int, default=0, help="unacked messages per consumer stream")
    p.add_argument("--no-purge", dest="purge", action="store_false", help="keep the queue's messages")
    p.add_argument("--with-echo", action="store_true", help="also run the echo ceiling, add the ratio")
    p.add_argument("--runs", type=int, default=1, help="repeat the run (one JSON line each)")
    add_json_argument(p, "each run (one object per line; default: one human line per run)")
