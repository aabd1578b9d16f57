"""A deterministic, seeded stream of encoded log entries exercising every command."""

from __future__ import annotations

import random

from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings

T0 = 1_700_000_000_000
PRODUCER = "00112233aabbccdd-"  # the canonical form of a producer's stamped dedup ids


def entries(seed: int, n: int, start_index: int = 1, start_ms: int = T0, *,
            group_policies: bool = True) -> list[tuple[int, bytes]]:
    """`n` log entries (some empty Raft no-ops). Ids are guessed (1..next), so some commands
    fail: failures must be deterministic too. `group_policies`: also fair-queue group
    weights and rates (`SetGroupPolicy`, group defaults in `UpdateQueue`), drawn from a
    stream of their own, so without them a seed gives the entries it gave before they
    existed (what an old data dir was written with)."""
    rnd = random.Random(seed)
    prnd = random.Random(seed * 7919 + 1)
    out: list[tuple[int, bytes]] = []
    now = start_ms
    guess = 1
    stamped = 1  # the next sequence number of PRODUCER's stamped dedup ids
    for i in range(n):
        index = start_index + i
        now += rnd.choice([0, 1, 5, 40, 200])
        if rnd.random() < 0.05:
            out.append((index, b""))
            continue
        cmds: list[c.Command] = []
        if i == 0 or rnd.random() < 0.02:
            cmds.append(c.CreateQueue("d", "delayed", QueueSettings(visibility_timeout_ms=100, max_attempts=2,
                                                                      dead_letter_queue="f")))
            cmds.append(c.CreateQueue("f", "fair", QueueSettings(visibility_timeout_ms=150,
                                                                   max_unacked_per_group=3,
                                                                   dedup_window_ms=500)))
        if group_policies and prnd.random() < 0.1:
            cmds.append(c.SetGroupPolicy(prnd.choice(["f", "f", "f", "d"]), f"g{prnd.randint(0, 3)}",
                                         prnd.choice([None, 0, 1, 3]), prnd.choice([None, -1, 0, 5, 50])))
        if group_policies and prnd.random() < 0.02:
            cmds.append(c.UpdateQueue("f", QueueSettings(
                visibility_timeout_ms=150, max_unacked_per_group=3, dedup_window_ms=500,
                default_group_weight=prnd.choice([0, 2]), default_group_max_per_second=prnd.choice([0, 20]))))
        for _ in range(rnd.randint(1, 4)):
            q = rnd.choice(["d", "f"])
            r = rnd.random()
            if r < 0.35:
                items = [c.EnqueueItem(rnd.randbytes(rnd.randint(0, 30)), f"g{rnd.randint(0, 3)}",
                                       rnd.choice([0, 1, 2, 9]), rnd.choice([{}, {"k": "v"}]),
                                       rnd.choice(["", "", "x", "y", f"u{i}"]), rnd.choice([0, 0, 30]))
                         for _ in range(rnd.randint(1, 5))]
                kind = rnd.random()
                if kind < 0.2:  # the column path, contents only
                    cmds.append(c.EnqueueColumns(q, [it.content for it in items]))
                elif kind < 0.35:  # the column path, a producer's stamped ids (runs; resends overlap)
                    seq = max(1, stamped - rnd.choice([0, 0, 0, 2]))
                    dids = [f"{PRODUCER}{s:012x}" for s in range(seq, seq + len(items))]
                    stamped = max(stamped, seq + len(items))
                    cmds.append(c.EnqueueColumns(q, [it.content for it in items], dedup_ids=dids))
                elif kind < 0.5:  # the column path, every column
                    cmds.append(c.EnqueueColumns(
                        q, [it.content for it in items], [it.group for it in items],
                        [it.priority for it in items], [it.metadata for it in items],
                        [it.dedup_id for it in items], [it.delay_ms for it in items]))
                else:
                    cmds.append(c.Enqueue(q, items))
                guess += len(items)
            elif r < 0.55:
                cmds.append(c.Dequeue(q, rnd.randint(1, 4), rnd.random() < 0.2))
            elif r < 0.70:
                cmds.append(c.Ack(q, [rnd.randint(1, guess) for _ in range(rnd.randint(1, 3))]))
            elif r < 0.76:
                cmds.append(c.Nack(q, rnd.randint(1, guess), 0, rnd.choice([0, 20]),
                                   rnd.choice([None, 3])))
            elif r < 0.80:
                cmds.append(c.Touch(q, rnd.randint(1, guess)))
            elif r < 0.85:
                cmds.append(c.UpdatePriority(q, rnd.randint(1, guess), rnd.randint(-3, 3)))
            elif r < 0.90:
                cmds.append(c.DeleteMessage(q, rnd.randint(1, guess)))
            elif r < 0.92:
                cmds.append(c.PurgeQueue(q))
            elif r < 0.93:
                cmds.append(c.DeleteQueue(q))
            else:
                cmds.append(c.Tick())
        out.append((index, encode_batch(c.CommandBatch(now, cmds))))
    return out


def scattered_tail(start_index: int, start_ms: int, first_id: int) -> list[tuple[int, bytes]]:
    """Entries that leave a delayed queue of random priorities part delivered (scattered
    ids: lease entries), part acked (gone notes) and touched: the lease table, gone and
    stale notes of the storage layout of issue 20 in a data dir. `first_id`: the id the
    queue's first message gets."""
    rnd = random.Random(20)
    prios = [rnd.randrange(10**6) for _ in range(300)]
    order = [first_id - 1 + i for i in sorted(range(1, 301), key=lambda i: (prios[i - 1], i))]  # the delivery order

    def b(i: int, *cmds: c.Command) -> tuple[int, bytes]:
        return start_index + i, encode_batch(c.CommandBatch(start_ms + i, list(cmds)))

    return [
        b(0, c.CreateQueue("big", "delayed", QueueSettings(visibility_timeout_ms=600_000))),
        b(1, c.EnqueueColumns("big", [b"b%d" % i for i in range(300)], priorities=prios)),
        b(2, c.Dequeue("big", 40)),
        b(3, c.Ack("big", order[:40:2], []), *(c.Touch("big", i, 0, 700_000) for i in order[1:10:2])),
        b(4, c.Dequeue("big", 30)),
        b(5, c.Ack("big", order[40:70:3], []), c.Nack("big", order[41], 0, delay_ms=5000)),
    ]
