"""A flooding client, run as its own process (`python -m tests.support.flood ...`): one
DequeueStream on QUEUE that sends, as fast as the transport takes them, requests of 100
ack ids of messages that do not exist, and never reads a reply. Frames alternate
between ids that were assigned and are gone (`--gone FIRST:LAST`) and ids never
assigned (from 10**12 up). Prints the number of requests the transport took, at the end
(SIGTERM or `--seconds`)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal

import grpc
from doq_proto.v1 import doq_pb2 as pb
from doq_proto.v1 import doq_pb2_grpc as pb_grpc

IDS_PER_FRAME = 100


async def flood(target: str, queue: str, gone: range, seconds: float) -> int:
    sent = 0
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    gone_ids = itertools.cycle(gone)
    unborn = itertools.count(10**12)

    async def requests():  # type: ignore[no-untyped-def]
        nonlocal sent
        yield pb.DequeueStreamRequest(queue_name=queue, prefetch=1, auto_credit=True)
        for frame in itertools.count():
            ids = [next(gone_ids) if frame % 2 else next(unborn) for _ in range(IDS_PER_FRAME)]
            yield pb.DequeueStreamRequest(ack_ids=ids)
            sent += 1

    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.DOQStub(channel).DequeueStream(requests())  # replies are never read
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            pass
        call.cancel()
    return sent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--gone", required=True, help="FIRST:LAST ids of messages that existed and are gone")
    p.add_argument("--seconds", type=float, default=60)
    ns = p.parse_args()
    first, last = (int(x) for x in ns.gone.split(":"))
    print(asyncio.run(flood(ns.target, ns.queue, range(first, last + 1), ns.seconds)), flush=True)


if __name__ == "__main__":
    main()
