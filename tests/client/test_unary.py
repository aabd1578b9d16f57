"""Every unary method of the sync client against a real node."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from doq_client import (
    AlreadyExists,
    DoqClient,
    EnqueueResult,
    InvalidArgument,
    MessageNotFound,
    NotFound,
    QueueNotFound,
    QueueSettings,
    StaleLease,
    TooLarge,
    enqueue_request,
)


def test_queue_lifecycle(client: DoqClient, queue_name: str) -> None:
    q = client.create_queue(
        queue_name, "fair", QueueSettings(visibility_timeout_ms=5000, max_attempts=3)
    )
    assert (q.name, q.type) == (queue_name, "fair")
    assert q.settings.visibility_timeout_ms == 5000 and q.settings.max_attempts == 3
    assert queue_name in [x.name for x in client.list_queues()]
    q = client.update_queue(queue_name, QueueSettings(visibility_timeout_ms=7000))
    assert q.settings.visibility_timeout_ms == 7000
    assert client.get_queue(queue_name).settings.visibility_timeout_ms == 7000
    with pytest.raises(AlreadyExists) as ei:
        client.create_queue(queue_name)
    assert ei.value.code == grpc.StatusCode.ALREADY_EXISTS
    client.enqueue(queue_name, b"a")
    client.enqueue(queue_name, b"b")
    assert client.get_queue(queue_name).stats.ready == 2
    assert client.purge_queue(queue_name) == 2
    assert client.get_queue(queue_name).stats.total == 0
    client.delete_queue(queue_name)
    assert queue_name not in [x.name for x in client.list_queues()]
    with pytest.raises(QueueNotFound):
        client.get_queue(queue_name)


def test_enqueue_fields_and_get(client: DoqClient, queue: str) -> None:
    r = client.enqueue(queue, "héllo", group="g1", priority=7, metadata={"k": "v"}, dedup_id="d-1")
    assert isinstance(r, EnqueueResult) and r.id > 0 and not r.duplicate
    again = client.enqueue(queue, "other", dedup_id="d-1")
    assert again.duplicate and again.id == r.id
    m = client.get(queue, r.id)
    assert (m.id, m.queue_name, m.text, m.group, m.priority) == (r.id, queue, "héllo", "g1", 7)
    assert m.metadata == {"k": "v"} and m.dedup_id == "d-1" and m.state == "ready"
    assert m.enqueued_at_ms > 0
    d = client.enqueue(queue, b"later", delay_ms=60_000)
    md = client.get(queue, d.id)
    assert md.state == "delayed" and md.deliver_at_ms >= md.enqueued_at_ms + 59_000
    stats = client.get_queue(queue).stats
    assert (stats.ready, stats.delayed, stats.total) == (1, 1, 2)
    client.delete(queue, d.id)
    with pytest.raises(MessageNotFound) as ei:
        client.get(queue, d.id)
    assert ei.value.reason == "MESSAGE_NOT_FOUND"


@pytest.mark.parametrize(
    ("bad", "error", "reason"),
    [
        (enqueue_request("bad name!", b"two"), InvalidArgument, "INVALID_QUEUE_NAME"),
        (None, TooLarge, "MESSAGE_TOO_LARGE"),  # content one byte over the limit (queue below)
    ],
)
def test_enqueue_batch_is_all_or_nothing(
    client: DoqClient, queue: str, bad: object, error: type[Exception], reason: str
) -> None:
    """One invalid message refuses the whole batch, naming it; nothing is enqueued (as over HTTP)."""
    bad = bad or enqueue_request(queue, b"x" * (1024 * 1024 + 1))
    reqs = [enqueue_request(queue, b"one"), bad, enqueue_request(queue, b"three", priority=1)]
    with pytest.raises(error) as ei:
        client.enqueue_batch(reqs)  # type: ignore[list-item]
    assert ei.value.reason == reason  # type: ignore[attr-defined]
    assert str(ei.value.message).startswith("messages[1]: ")  # type: ignore[attr-defined]
    assert "nothing was enqueued" in ei.value.message  # type: ignore[attr-defined]
    assert client.get_queue(queue).stats.total == 0


def test_enqueue_batch_one_command_per_queue(client: DoqClient, queue: str) -> None:
    """Valid messages for several queues: a queue's command fails or succeeds as a whole."""
    reqs = [enqueue_request(queue, b"one"), enqueue_request("no-such-queue-xyz", b"two"),
            enqueue_request(queue, b"three")]
    out = client.enqueue_batch(reqs)
    assert isinstance(out[0], EnqueueResult) and isinstance(out[2], EnqueueResult)
    assert isinstance(out[1], QueueNotFound)
    assert client.get_queue(queue).stats.ready == 2


def test_dequeue_ack_nack_touch_priority(client: DoqClient, queue: str) -> None:
    ids = [client.enqueue(queue, f"m{i}".encode(), priority=i).id for i in range(4)]
    [m0] = client.dequeue(queue, visibility_timeout_ms=10_000)
    assert m0.id == ids[0] and m0.state == "in_flight" and m0.attempts == 1 and m0.lease_id
    assert client.get_queue(queue).stats.in_flight == 1
    until = client.touch(queue, m0.id, lease_id=m0.lease_id, visibility_timeout_ms=20_000)
    # the lease now ends 20 s after the touch, so at least 10 s later than the dequeue's 10 s
    assert until >= m0.lease_expires_at_ms + 10_000
    assert client.get(queue, m0.id).lease_expires_at_ms == until  # stored, not only answered
    client.ack(queue, m0.id, lease_id=m0.lease_id)
    with pytest.raises(NotFound):
        client.get(queue, m0.id)

    got = client.dequeue(queue, max_messages=2)
    assert [m.id for m in got] == ids[1:3]
    # nack m1 with a new priority: it goes behind m3
    client.nack(queue, got[0].id, lease_id=got[0].lease_id, priority=100)
    assert client.get(queue, got[0].id).priority == 100
    res = client.ack_batch(queue, [got[1].id, 999_999_999], [got[1].lease_id, 1])
    assert res[0].ok and res[0].id == got[1].id
    assert not res[1].ok and isinstance(res[1].error, NotFound)

    m3 = client.update_priority(queue, ids[3], -5)
    assert m3.priority == -5
    [a, b] = client.dequeue(queue, max_messages=5)
    assert [a.id, b.id] == [ids[3], ids[1]]
    assert b.attempts == 2
    # nack with a delay: not deliverable for now
    client.nack(queue, a.id, lease_id=a.lease_id, delay_ms=60_000)
    assert client.get(queue, a.id).state == "delayed"
    client.ack(queue, b.id, lease_id=b.lease_id)
    assert client.dequeue(queue) == []


def test_stale_lease(client: DoqClient, queue: str) -> None:
    client.enqueue(queue, b"x")
    [m] = client.dequeue(queue, visibility_timeout_ms=10_000)
    client.nack(queue, m.id, lease_id=m.lease_id)
    [m2] = client.dequeue(queue)
    assert m2.id == m.id and m2.lease_id != m.lease_id
    with pytest.raises(StaleLease) as ei:
        client.ack(queue, m.id, lease_id=m.lease_id)
    assert ei.value.code == grpc.StatusCode.ABORTED and ei.value.reason
    client.ack(queue, m2.id, lease_id=m2.lease_id)


def test_dequeue_with_ack_removes(client: DoqClient, queue: str) -> None:
    r = client.enqueue(queue, b"once")
    [m] = client.dequeue(queue, ack=True)
    assert m.id == r.id and m.content == b"once"
    assert client.get_queue(queue).stats.total == 0
    with pytest.raises(NotFound):
        client.get(queue, r.id)


def test_long_poll_returns_when_a_message_arrives(client: DoqClient, queue: str) -> None:
    def later() -> None:
        time.sleep(0.3)
        client.enqueue(queue, b"wake")

    t = threading.Thread(target=later)
    t0 = time.monotonic()
    t.start()
    got = client.dequeue(queue, wait_ms=60_000)
    elapsed = time.monotonic() - t0
    t.join()
    assert [m.content for m in got] == [b"wake"]
    assert 0.25 <= elapsed < 30  # woken by the message, long before the poll's end (no tight bound: loaded CI)
    t0 = time.monotonic()
    assert client.dequeue(queue, wait_ms=200) == []
    assert time.monotonic() - t0 >= 0.19


def test_error_mapping_and_nothing_changes(client: DoqClient, queue: str) -> None:
    client.enqueue(queue, b"keep")
    before = sorted((q.name, q.stats.total) for q in client.list_queues())

    with pytest.raises(QueueNotFound) as ei:
        client.enqueue("no-such-queue-xyz", b"x")
    e = ei.value
    assert isinstance(e, NotFound)
    assert e.code == grpc.StatusCode.NOT_FOUND and e.reason == "QUEUE_NOT_FOUND" and not e.retryable

    with pytest.raises(InvalidArgument) as ei2:
        client.create_queue("bad name!")
    assert ei2.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert ei2.value.reason == "INVALID_QUEUE_NAME" and not ei2.value.retryable

    with pytest.raises(InvalidArgument):
        client.create_queue("fine-name", "lifo")
    with pytest.raises(InvalidArgument):
        client.dequeue(queue, max_messages=1_000_000)
    with pytest.raises(InvalidArgument):
        client.enqueue(queue, b"x", delay_ms=10**15)
    with pytest.raises(QueueNotFound):
        client.dequeue("no-such-queue-xyz")

    after = sorted((q.name, q.stats.total) for q in client.list_queues())
    assert after == before
