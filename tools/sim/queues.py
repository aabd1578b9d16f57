"""The simulator's queue workload (`SimOptions.queues`): every node also applies the real
queue state machine (`doq.queues.machine.QueueMachine` over a `MemoryStore`) to the
entries that carry an encoded `CommandBatch`, and the checker holds the queues to
conservation under the simulated faults.

The workload (`QueueWorkload`) proposes, on the leader and stamped with its virtual clock:
enqueues of unique payloads into a dead-letter queue `dlq`, redrives of `dlq` back to
`src` (its source: `src` dead-letters into it) with and without a rate, cancels, dequeues
with ack from `src`, and the `Tick`s the machine asks for (`next_due_ms`, as a real
leader does), so redrive steps run across leader changes, crashes and snapshots.

The check (`QueueCheck`): the state machine's digest is folded into each node's applied
hash (replicas must agree byte for byte, per index), and at the end every payload whose
enqueue was applied is, exactly once, either delivered by an applied dequeue or stored in
a queue of a live member: nothing lost, nothing twice, nothing unexpected.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from hashlib import blake2b

from doq.errors import DoqError
from doq.queues import codec
from doq.queues import commands as c
from doq.queues import records as R
from doq.queues.machine import QueueMachine
from doq.queues.model import MessageView, QueueSettings
from doq.queues.redrive import CancelRedrive, StartRedrive
from doq.queues.store import MemoryStore

PREFIX = b"Q"  # entries of the queue workload (the others are the toy proposals)
MS_PER_STEP = 10  # virtual milliseconds per simulation step
DLQ, SRC = "dlq", "src"
_SETUP: list[c.Command] = [
    c.CreateQueue(DLQ, "fair", QueueSettings()),
    c.CreateQueue(SRC, "delayed", QueueSettings(max_attempts=2, dead_letter_queue=DLQ)),
]
_LEN = struct.Struct(">I")


class QueueReplica:
    """One node's queue state: the machine, its records, and what its last apply returned."""

    __slots__ = ("store", "machine", "last")

    def __init__(self, dump: bytes = b"") -> None:
        self.store = MemoryStore()
        self.machine = QueueMachine(self.store)
        self.last: tuple[c.CommandBatch, list[object]] | None = None
        if dump:
            pos = 0
            while pos < len(dump):
                n = _LEN.unpack_from(dump, pos)[0]
                k = dump[pos + 4 : pos + 4 + n]
                pos += 4 + n
                n = _LEN.unpack_from(dump, pos)[0]
                self.store.data[k] = dump[pos + 4 : pos + 4 + n]
                pos += 4 + n
            self.machine.load(self.store.items())

    def apply(self, index: int, data: bytes) -> None:
        self.last = None
        if data.startswith(PREFIX):
            batch = codec.decode_batch(data[len(PREFIX):])
            self.last = (batch, self.machine.apply(index, batch))

    def dump(self) -> bytes:
        """Every record, length-prefixed, in key order (also what `digest` hashes)."""
        return b"".join(_LEN.pack(len(x)) + x for k, v in self.store.items() for x in (k, v))

    def digest(self) -> bytes:
        return blake2b(self.dump(), digest_size=16).digest()

    def contents(self) -> Counter[bytes]:
        """The payloads stored in every queue."""
        out: Counter[bytes] = Counter()
        for k, v in self.store.items():
            if k[0] == ord("M"):
                out[R.message_parts(v)[3]] += 1
        return out


class QueueWorkload:
    """The leader-side proposals of the queue workload (randomness from the sim's rng)."""

    def __init__(self) -> None:
        self.payloads = 0

    def batch(self, rng: random.Random, now_step: int) -> bytes:
        """One random command after the (idempotent) queue set-up, stamped now."""
        r = rng.random()
        cmd: c.Command
        if r < 0.45:
            self.payloads += 1
            cmd = c.Enqueue(DLQ, [c.EnqueueItem(b"q%d" % self.payloads, group=rng.choice(["", "a", "b"]))])
        elif r < 0.6:
            cmd = StartRedrive(DLQ, rng.choice(["", SRC]), rng.choice([0, 0, 5, 40]))
        elif r < 0.66:
            cmd = CancelRedrive(DLQ)
        elif r < 0.9:
            cmd = c.Dequeue(SRC, rng.randint(1, 4), ack=True)
        else:
            cmd = c.Tick()
        return encode(now_step, [*_SETUP, cmd])

    @staticmethod
    def due(replica: QueueReplica, now_step: int) -> bytes | None:
        """A Tick when the leader's applied state asks for one (a redrive's next step)."""
        due = replica.machine.next_due_ms()
        if due is not None and due <= now_step * MS_PER_STEP:
            return encode(now_step, [c.Tick()])
        return None


def encode(now_step: int, cmds: list[c.Command]) -> bytes:
    return PREFIX + codec.encode_batch(c.CommandBatch(now_step * MS_PER_STEP, cmds))


class QueueCheck:
    """Conservation of payloads across the applied log (first application of each index)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.enqueued: Counter[bytes] = Counter()
        self.delivered: Counter[bytes] = Counter()
        self.redrive_moves = 0  # messages moved by redrives (a live member's final count)

    def on_apply(self, index: int, replica: QueueReplica) -> None:
        if index in self.seen or replica.last is None:
            return
        self.seen.add(index)
        batch, results = replica.last
        for cmd, res in zip(batch.commands, results, strict=True):
            if isinstance(cmd, c.Enqueue) and isinstance(res, list):
                for it, r in zip(cmd.items, res, strict=True):
                    if not isinstance(r, DoqError):
                        self.enqueued[it.content] += 1
            elif isinstance(cmd, c.Dequeue) and isinstance(res, list):
                for v in res:
                    assert isinstance(v, MessageView)
                    self.delivered[v.content] += 1

    def problems(self, replica: QueueReplica) -> list[str]:
        """What breaks conservation in `replica`'s state ([] if nothing)."""
        stored = replica.contents()
        out: list[str] = []
        twice = [p for p, n in (stored + self.delivered).items() if n > 1]
        if twice:
            out.append(f"queue conservation: payloads held or delivered twice: {sorted(twice)[:5]}")
        lost = self.enqueued - stored - self.delivered
        if lost:
            out.append(f"queue conservation: payloads lost: {sorted(lost)[:5]}")
        extra = (stored + self.delivered) - self.enqueued
        if extra:
            out.append(f"queue conservation: payloads never enqueued: {sorted(extra)[:5]}")
        task = replica.machine.redrive.tasks.get(DLQ)
        self.redrive_moves = task.moved if task is not None else 0
        return out
