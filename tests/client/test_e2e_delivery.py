"""A producer and a consumer at once through a real `doq serve` (the e2e benchmark's
shape, in threads): every message is confirmed, delivered exactly once and settled. The
node hands each Ready to its writer thread and back (`WriterThread`): a job lost, run
twice or answered to the wrong Ready would show here as a message missing, duplicated or
a confirmation never resolved. Bounded waits only; nothing is timed."""

from __future__ import annotations

import threading
import time

from doq_client import DoqClient

COUNT = 3000


def test_paced_producer_and_consumer_deliver_every_message_once(client: DoqClient, queue: str) -> None:
    seen: list[int] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with client.consumer(queue, prefetch=1000) as cons:
                for m in cons:
                    seen.append(int(m.content))
                    cons.ack(m)
                    if len(seen) == COUNT:
                        return
        except BaseException as e:  # reported below
            errors.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    p = client.producer()
    futures = []
    for i in range(COUNT):
        futures.append(p.enqueue(queue, b"%d" % i))
        if i % 20 == 0:
            time.sleep(0.002)  # a paced producer (not a wait for anything)
    for f in futures:
        f.result(timeout=60)
    p.close()
    consumer.join(120)
    assert not consumer.is_alive(), f"the consumer got {len(seen)} of {COUNT}"
    assert not errors, errors
    assert sorted(seen) == list(range(COUNT))  # none lost, none twice
    deadline = time.monotonic() + 30
    while client.get_queue(queue).stats.total and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.get_queue(queue).stats.total == 0  # every ack settled
