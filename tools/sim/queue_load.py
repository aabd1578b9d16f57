"""The simulation's proposals as queue commands, and the replay check of what committed.

`QueueLoad` draws each proposal as an encoded `CommandBatch` for the queue state machine
(`doq.queues`): enqueues to a fair queue and a delayed one, dequeues (leased or acked),
acks, fair-queue group weights and rates (`SetGroupPolicy`, group defaults in
`UpdateQueue`) and ticks, its replicated time a function of the proposal number. Every
proposal is distinct (its time), as the checker's bookkeeping needs.

`replay_violations(log)` applies the committed log (in index order, as every member
does) to one machine straight, and to another that is rebuilt from its records alone
halfway (as a member that installs a snapshot), and names any difference in results or
records: the queue machine must be a deterministic function of the log, throttling and
weighted rotation included.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from doq.queues import codec
from doq.queues import commands as c
from doq.queues.machine import QueueMachine
from doq.queues.model import QueueCounters, QueueInfo, QueueSettings
from doq.queues.store import MemoryStore

T0_MS = 1_700_000_000_000
GROUPS = ("g0", "g1", "g2", "g3")


class QueueLoad:
    """Random queue command batches (all randomness from its own `rng`)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ids = 0  # message ids guessed for acks (the machine counts from 1)

    def batch(self, pid: int) -> bytes:
        rng = self.rng
        now = T0_MS + pid * rng.choice([1, 7, 40])
        cmds: list[c.Command] = []
        if pid == 1 or rng.random() < 0.02:
            cmds += [c.CreateQueue("f", "fair", QueueSettings(visibility_timeout_ms=300, max_attempts=3,
                                                              default_group_max_per_second=200)),
                     c.CreateQueue("d", "delayed", QueueSettings(visibility_timeout_ms=200))]
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            q = rng.choice(["f", "f", "d"])
            if r < 0.4:
                n = rng.randint(1, 4)
                cmds.append(c.Enqueue(q, [c.EnqueueItem(b"p%d-%d" % (pid, i), rng.choice(GROUPS))
                                          for i in range(n)]))
                self.ids += n
            elif r < 0.65:
                cmds.append(c.Dequeue(q, rng.randint(1, 5), rng.random() < 0.5, 0, rng.getrandbits(64)))
            elif r < 0.75:
                cmds.append(c.Ack(q, [rng.randint(1, max(1, self.ids)) for _ in range(rng.randint(1, 3))]))
            elif r < 0.88:
                cmds.append(c.SetGroupPolicy(q, rng.choice(GROUPS), rng.choice([None, 0, 1, 3, 6]),
                                             rng.choice([None, -1, 0, 2, 50])))
            elif r < 0.92:
                cmds.append(c.UpdateQueue("f", QueueSettings(
                    visibility_timeout_ms=300, max_attempts=3, default_group_weight=rng.choice([0, 2]),
                    default_group_max_per_second=rng.choice([0, 20, 200]))))
            else:
                cmds.append(c.Tick())
        return codec.encode_batch(c.CommandBatch(now, cmds))


def _decode(data: bytes) -> c.CommandBatch | None:
    """A queue command batch, or None for other entries (no-ops, markers, test payloads)."""
    if not data:
        return None
    try:
        return codec.decode_batch(data)
    except Exception:  # noqa: BLE001 (anything that is not a batch is not the machine's)
        return None


def _norm(results: list[object]) -> str:
    """Results as replicas must agree on them (a `QueueInfo`'s counters are per node:
    they restart from 0 on a rebuild, by design)."""
    return repr([dataclasses.replace(r, counters=QueueCounters()) if isinstance(r, QueueInfo) else r
                 for r in results])


def replay_violations(log: Sequence[tuple[int, bytes]]) -> list[str]:
    """Differences between a straight replay of `log` ((index, data) in index order) and
    one rebuilt from its records halfway; [] when they agree."""
    batches = [(i, bt) for i, d in log if (bt := _decode(d)) is not None]
    a = QueueMachine(MemoryStore())
    b_store = MemoryStore()
    b = QueueMachine(b_store)
    half = len(batches) // 2
    out: list[str] = []
    for k, (index, batch) in enumerate(batches):
        if k == half:
            b = QueueMachine(b_store)
            b.load(b_store.items())
        ra, rb = a.apply(index, batch), b.apply(index, batch)
        if _norm(ra) != _norm(rb):
            out.append(f"queue machine: entry {index} gives different results after a rebuild: {ra!r} {rb!r}")
            break
    if a.store.data != b_store.data:  # type: ignore[attr-defined]
        out.append("queue machine: the records differ after a rebuild from records")
    for q in sorted(a.queues):
        if a.group_stats(q) != b.group_stats(q):
            out.append(f"queue machine: groups of {q!r} differ after a rebuild")
    return out
