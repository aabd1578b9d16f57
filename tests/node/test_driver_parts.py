"""The driver's pure parts, alone: what a leader releases of dequeues that committed after
their lease ended (`doq.node.late_dequeues`), and what a write's growth counts against a
store near its limit (`doq.node.storage_admission.content_bytes`). Real commands and
message views; no node (the driver's use of them is covered in tests/node/test_raft_node.py
and tests/node/test_storage_alarms.py)."""

from __future__ import annotations

from doq.node.late_dequeues import releases
from doq.node.storage_admission import content_bytes
from doq.queues import commands
from doq.queues.model import MessageState, MessageView


def view(mid: int, lease_id: int, lease_end_ms: int) -> MessageView:
    return MessageView(mid, "q", "", 0, 1, 0, lease_end_ms, 0, MessageState.IN_FLIGHT, lease_id=lease_id)


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now_ms


def test_only_the_messages_of_ended_leases_are_released_and_the_clock_is_read_once() -> None:
    ended = [view(1, 11, 900), view(2, 11, 900)]  # one dequeue's messages share one lease
    live = [view(3, 12, 1_500)]
    removed = [view(4, 0, 0)]  # removed on delivery: no lease
    results: list[list[object]] = [[ended, None], [live, removed, "not a dequeue", []]]
    clock = Clock(1_000)
    assert list(releases(results, clock)) == [
        commands.Nack("q", 1, 11, release=True), commands.Nack("q", 2, 11, release=True)]
    assert clock.reads == 1


def test_no_leased_messages_no_clock_read() -> None:
    clock = Clock(1_000)
    assert list(releases([[None, [view(4, 0, 0)], []]], clock)) == []
    assert clock.reads == 0


def test_growth_counts_contents_and_a_record_overhead() -> None:
    enq = commands.Enqueue("q", [commands.EnqueueItem(b"abc"), commands.EnqueueItem(b"")])
    assert content_bytes(enq) == 3 + 64 + 64
    assert content_bytes(commands.Ack("q", [1], [2])) == 64
