"""A real backup chain (full + incremental) for restore tests, written from a real
`StateStore` (LMDB) driven by real commands at the wall clock, and the digest an offline
restore of it gives.

Nothing in the chain's state falls due for an hour (delays and leases), so a cluster that
restores it proposes no `Tick` that would change the state before a test compares digests.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from doq.backup.ops import restore_offline, write_backup
from doq.queues import commands as c
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class RestoreChain:
    full: Path
    inc: Path
    to_version: int  # the incremental's (the chain's)
    digest: int  # of the state an offline restore of full + inc gives
    messages: int  # live messages in that state
    cluster_id: str  # the source's, recorded in both files

    @property
    def paths(self) -> list[Path]:
        return [self.full, self.inc]


def digest_of_offline_restore(paths: list[Path], work: Path) -> int:
    """Restore `paths` offline into a fresh data dir under `work`; its state digest."""
    restore_offline(work, "restored", paths[0], paths[1:])
    env = open_env(node_dir(work, "restored") / "doq.lmdb", map_size=1 << 30)
    try:
        return StateStore(env).state_digest()[1]
    finally:
        env.close()


def build_chain(root: Path, *, messages: int = 300, content_bytes: int = 60, seed: int = 1,
                first_index: int = 1000) -> RestoreChain:
    """Under `root`: a source store whose log starts at `first_index` (a source with a long
    history: its versions are ahead of a young cluster's log), `full.bak` (queues "jobs"
    and "fair", `messages` messages, some delayed, some leased, some acked and deleted:
    tombstones), then more changes and `inc.bak` (since the full's last version + 1)."""
    rnd = random.Random(seed)
    env = open_env(root / "source", map_size=4 << 30)
    st = StateStore(env)
    cluster_id = st.ensure_cluster_id(lambda: f"source-{seed}")
    index = first_index - 1

    def apply(*cmds: c.Command) -> list[object]:
        nonlocal index
        index += 1
        with st.write() as txn:
            return st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(int(time.time() * 1000), list(cmds))))])[0]

    try:
        apply(c.CreateQueue("jobs", "delayed", QueueSettings(visibility_timeout_ms=HOUR_MS)),
              c.CreateQueue("fair", "fair", QueueSettings(visibility_timeout_ms=HOUR_MS)))
        for start in range(0, messages, 1000):
            n = min(1000, messages - start)
            apply(c.EnqueueColumns("jobs", [rnd.randbytes(content_bytes) for _ in range(n)],
                                   priorities=[rnd.randint(0, 9) for _ in range(n)],
                                   delays_ms=[HOUR_MS if i % 7 == 0 else 0 for i in range(n)]))
        apply(c.Enqueue("fair", [c.EnqueueItem(b"f%d" % i, group=f"g{i % 3}", dedup_id=f"d{i}") for i in range(20)]))
        apply(c.Dequeue("jobs", max_messages=10))  # leased for an hour
        acked = apply(c.Dequeue("jobs", max_messages=5, ack=True))[0]
        assert isinstance(acked, list) and len(acked) == 5
        full = root / "full.bak"
        with open(full, "wb") as f:
            last = write_backup(st, 0, f)
        apply(c.DeleteMessage("jobs", messages - 1), c.DeleteMessage("jobs", messages - 2))
        apply(c.Enqueue("jobs", [c.EnqueueItem(b"later-%d" % i, delay_ms=HOUR_MS) for i in range(5)]))
        apply(c.Dequeue("fair", max_messages=2, ack=True))
        inc = root / "inc.bak"
        with open(inc, "wb") as f:
            write_backup(st, last + 1, f)
        to_version, digest = st.state_digest()
        total = sum(q.stats.total for q in st.list_queues())
    finally:
        env.close()
    chain = RestoreChain(full, inc, to_version, digest, total, cluster_id)
    assert digest_of_offline_restore(chain.paths, root / "offline") == digest
    return chain
