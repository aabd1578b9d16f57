"""What the client door adds per frame and per call, measured on the handler objects the
gRPC interceptor builds (no network, no node): `python bench/door_micro.py`.

A stream handler that answers each request frame is run over 200k frames, bare and as
`doq.auth.grpc_door._queue_checked` wraps it for a prefix-limited key (CPU time per
frame); then `Authorizer.authenticate` (once per call or stream)."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq_proto.v1 import doq_pb2 as pb

from doq.auth import tokens
from doq.auth.authorizer import Authorizer, principal_of
from doq.auth.grpc_door import _queue_checked
from doq.auth.table import GRPC_RULES
from doq.queues.apikeys import KeyRecord, parse_scopes

N = 200_000
new = tokens.new_key()
rec = KeyRecord(new.id, new.secret_hash, parse_scopes(["produce:sbs-", "consume:sbs-"]), 0)
authz = Authorizer(lambda: {rec.id: rec}, required=True)
who = principal_of(rec)
enq = pb.EnqueueBatchRequest(columns=pb.EnqueueColumns(queue_name="sbs-x", contents=[b"x"]))
ack = pb.DequeueStreamRequest(ack_ids=[1])
resp = pb.EnqueueBatchResponse(ids=[1])

class _Context:
    async def abort(self, *args: object) -> None:
        raise RuntimeError(args)

    def set_trailing_metadata(self, md: object) -> None:
        pass

async def run(method: str, req: Any, wrap: bool) -> float:
    async def servicer(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield resp
    handler = grpc.stream_stream_rpc_method_handler(servicer, request_deserializer=type(req).FromString)
    if wrap:
        handler = _queue_checked(handler, authz, who, GRPC_RULES["/doq.v1.DOQ/" + method])
    async def src() -> Any:
        for _ in range(N):
            yield req
    t = time.process_time()
    async for _ in handler.stream_stream(src(), _Context()):
        pass
    return (time.process_time() - t) / N * 1e6

async def main() -> None:
    for method, req in (("EnqueueBatchStream", enq), ("DequeueBatchStream", ack)):
        for _ in range(3):
            base = await run(method, req, False)
            wrapped = await run(method, req, True)
            print(f"{method}: {base:.2f} -> {wrapped:.2f} us per frame (+{wrapped - base:.2f})")
    t = time.process_time()
    for _ in range(N):
        authz.authenticate(b"Bearer " + new.token.encode())
    print(f"authenticate (once per call or stream): {(time.process_time() - t) / N * 1e6:.2f} us")
if __name__ == "__main__":
    asyncio.run(main())
