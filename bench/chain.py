"""A big backup chain, quickly, for `doq verify` figures (not a test):
`python bench/chain.py --dir DIR [--messages 10000000] [--files 4] [--value-bytes 100]`.

Writes DIR/000000-full.bak and DIR/00000N-since-V.bak (the layout of `doq backup --dir`)
straight from a synthetic history, without a node: records encoded by doq.queues (the
node's own encoders) and the state digest recorded in each footer by doq.storage.digest,
so `doq verify --dir DIR` must prove it. The history, one log entry per batch of 1000:

- full backup: queues `orders` (delayed, dead letters to `dead`), `events` (fair, 8
  groups), `dead`, `tmp`; half of the messages enqueued (1 in 50 delayed by an hour, 1 in
  1000 with a dedup id, a few in `tmp`).
- each incremental: the next share of new messages; of the messages of the previous file
  1 in 4 acked (tombstones), 1 in 4 dequeued (in flight), 1 in 20 re-prioritized, 1 in
  100 dead-lettered (a tombstone, a new message in `dead`, the source's dead count); the
  last one also deletes queue `tmp` (tombstones of the queue, its messages and dedup ids).

The state is valid: `doq restore` of the chain into a node loads it (tests check that and
that the node's digest equals the recorded one). Speed: ~3-4 us per record (pure Python).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.backup.format import DEFAULT_FRAME_BYTES, BackupWriter, Record
from doq.queues import keys as K
from doq.queues import records as R
from doq.queues.model import QueueSettings, QueueType
from doq.storage import digest as D

T0 = 1_700_000_000_000
BATCH = 1000
HOUR_MS = 3_600_000
QUEUES = ("orders", "events")  # where messages go, by id parity
_SETTINGS = {
    "orders": (QueueType.DELAYED, QueueSettings(max_attempts=5, dead_letter_queue="dead")),
    "events": (QueueType.FAIR, QueueSettings(max_unacked_per_group=10)),
    "dead": (QueueType.DELAYED, QueueSettings()),
    "tmp": (QueueType.DELAYED, QueueSettings()),
}
TMP_MESSAGES = 50
_PAD = random.Random(1).randbytes(8192).hex().encode()  # message bodies: hex text, ~2x compressible


@dataclass
class _Msg:
    """Formulas for message `id_` (everything derives from the id and its phase)."""

    id_: int
    version: int
    value_bytes: int

    @property
    def queue(self) -> str:
        return QUEUES[self.id_ % 2]

    def key(self) -> bytes:
        return K.message_key(self.queue, self.id_)

    def value(self, *, priority: int | None = None, lease: int = 0) -> bytes:
        i = self.id_
        group = f"g{i % 8}".encode() if self.queue == "events" else b""
        dedup = f"d{i}".encode() if i % 1000 == 7 else b""
        not_before = T0 + self.version + (HOUR_MS if i % 50 == 3 else 0)
        off = (i * 7919) % 8192
        body = b"%012d" % i + _PAD[off : off + max(0, self.value_bytes - 12)]
        return R.encode_message(
            i % 10 if priority is None else priority, not_before, T0 + self.version, group, dedup, b"",
            body[: self.value_bytes],
            attempts=1 if lease else 0, lease_expires_at_ms=T0 + self.version + 30_000 if lease else 0,
            lease_id=lease, flags=R.FLAG_IN_FLIGHT if lease else 0,
        )


class _History:
    """Emits the records of each file in version order and keeps the running digest."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = value_bytes
        self.version = 0
        self.next_id = 1
        self.next_lease = 1
        self.digest = 0
        self.dead = {"orders": 0, "events": 0}
        self.queue_versions = {"orders": 1, "events": 1}
        self.tmp_ids: list[int] = []
        self.meta_version = 0
        self.tmp_version = 0
        self.phase = (1, 1, 1)  # ids [first, end) of the last enqueue phase, its first version

    def _live(self, key: bytes, value: bytes, version: int, old: tuple[bytes, int] | None = None) -> Record:
        self.digest += D.item_hash(key, value, version)
        if old is not None:
            self.digest -= D.item_hash(key, old[0], old[1])
        return key, value, version

    def _gone(self, key: bytes, version: int, old: tuple[bytes, int]) -> Record:
        self.digest -= D.item_hash(key, old[0], old[1])
        return key, None, version

    def _queue(self, name: str, version: int, old_version: int | None = None, old_dead: int = 0) -> Record:
        qtype, s = _SETTINGS[name]
        value = R.encode_queue(qtype, s, self.dead.get(name, 0), "")
        old = None if old_version is None else (R.encode_queue(qtype, s, old_dead, ""), old_version)
        return self._live(K.queue_key(name), value, version, old)

    def _tmp_message(self, i: int) -> bytes:
        return R.encode_message(0, T0 + self.tmp_version, T0 + self.tmp_version, b"", b"", b"", b"tmp %d" % i)

    def _meta(self) -> bytes:
        return R.META_REC.pack(self.next_id, T0 + self.version, self.next_lease)

    def full(self, n: int) -> Iterator[Record]:
        self.version = 1
        for name in _SETTINGS:
            yield self._queue(name, 1)
        yield from self._enqueue(n)
        self.tmp_version = self.version
        for _ in range(TMP_MESSAGES):  # a few messages of queue `tmp`, deleted later
            i = self.next_id
            self.next_id += 1
            self.tmp_ids.append(i)
            yield self._live(K.message_key("tmp", i), self._tmp_message(i), self.version)
        self.meta_version = self.version
        yield self._live(K.META_KEY, self._meta(), self.version)

    def _enqueue(self, n: int) -> Iterator[Record]:
        self.phase = (self.next_id, self.next_id + n, self.version + 1)
        first = self.next_id
        for start in range(first, first + n, BATCH):
            self.version += 1
            for i in range(start, min(start + BATCH, first + n)):
                m = _Msg(i, self.version, self.value_bytes)
                yield self._live(m.key(), m.value(), self.version)
                if i % 1000 == 7:
                    dkey = K.dedup_key(m.queue, f"d{i}")
                    yield self._live(dkey, R.DEDUP_REC.pack(i, T0 + self.version + 300_000), self.version)
        self.next_id = first + n

    def incremental(self, n: int, *, delete_tmp: bool) -> Iterator[Record]:
        prev_first, prev_end, prev_v0 = self.phase
        old_meta = (self._meta(), self.meta_version)
        yield from self._enqueue(n)

        def enq_version(i: int) -> int:
            return prev_v0 + (i - prev_first) // BATCH

        def work(pick: int, mod: int) -> Iterator[_Msg]:
            return (_Msg(i, enq_version(i), self.value_bytes)
                    for i in range(prev_first, prev_end) if i % mod == pick)

        def entries(msgs: Iterator[_Msg]) -> Iterator[tuple[int, _Msg]]:
            for k, m in enumerate(msgs):
                if k % BATCH == 0:
                    self.version += 1
                yield self.version, m

        for v, m in entries(work(0, 4)):  # acks: tombstones
            yield self._gone(m.key(), v, (m.value(), m.version))
        for v, m in entries(work(1, 4)):  # dequeues: in flight
            lease = self.next_lease
            self.next_lease += 1
            new = _Msg(m.id_, v, self.value_bytes)
            yield self._live(m.key(), new.value(lease=lease), v, (m.value(), m.version))
        for v, m in entries(work(2, 20)):  # priority changes
            new = _Msg(m.id_, v, self.value_bytes)
            yield self._live(m.key(), new.value(priority=-5), v, (m.value(), m.version))
        self.version += 1  # one entry dead-letters 1 in 100 (of those not touched above)
        v = self.version
        old_dead = dict(self.dead)
        for m in work(3, 100):
            yield self._gone(m.key(), v, (m.value(), m.version))
            self.dead[m.queue] += 1
            i = self.next_id
            self.next_id += 1
            yield self._live(K.message_key("dead", i), R.encode_message(
                m.id_ % 10, T0 + v, T0 + v, b"", b"", b"", b"dead letter of %d" % m.id_), v)
        for name in ("orders", "events"):
            if self.dead[name] != old_dead[name]:
                yield self._queue(name, v, self.queue_versions[name], old_dead[name])
                self.queue_versions[name] = v
        if delete_tmp and self.tmp_ids:
            self.version += 1
            v = self.version
            qtype, s = _SETTINGS["tmp"]
            yield self._gone(K.queue_key("tmp"), v, (R.encode_queue(qtype, s, 0, ""), 1))
            for i in self.tmp_ids:
                yield self._gone(K.message_key("tmp", i), v, (self._tmp_message(i), self.tmp_version))
            self.tmp_ids = []
        yield self._live(K.META_KEY, self._meta(), self.version, old_meta)
        self.meta_version = self.version

    def last_version(self, n: int, *, full: bool, delete_tmp: bool = False) -> int:
        """The version the next phase (`full` or incremental of `n` new messages) ends at."""
        v = self.version + (1 if full else 0) + -(-n // BATCH)
        if full:
            return v
        a, b, _ = self.phase
        for pick, mod in ((0, 4), (1, 4), (2, 20)):
            v += -(-_count(a, b, pick, mod) // BATCH)
        return v + 1 + (1 if delete_tmp and self.tmp_ids else 0)


def _count(a: int, b: int, pick: int, mod: int) -> int:
    """How many i in [a, b) have i % mod == pick."""
    def below(x: int) -> int:
        return max(0, (x - pick + mod - 1) // mod)
    return below(b) - below(a)


@dataclass(frozen=True)
class ChainFile:
    path: Path
    since: int
    to_version: int
    records: int
    bytes: int
    digest: int


def generate(directory: str | os.PathLike[str], messages: int, files: int = 4, *, value_bytes: int = 100,
             frame_bytes: int = DEFAULT_FRAME_BYTES) -> list[ChainFile]:
    """Write the chain (see the module docstring); returns what each file holds."""
    if files < 1 or messages < 0:
        raise ValueError("need files >= 1 and messages >= 0")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    h = _History(value_bytes)
    first = messages // 2 if files > 1 else messages
    rest = [(messages - first) // (files - 1)] * (files - 1) if files > 1 else []
    if rest:
        rest[-1] += messages - first - sum(rest)
    made: list[ChainFile] = []
    since = 0
    for j in range(files):
        last = j == files - 1
        n = first if j == 0 else rest[j - 1]
        to_version = h.last_version(n, full=j == 0, delete_tmp=last)
        records = h.full(n) if j == 0 else h.incremental(n, delete_tmp=last)
        path = out_dir / (f"{j:06d}-full.bak" if j == 0 else f"{j:06d}-since-{since}.bak")
        with open(path, "wb") as f:
            w = BackupWriter(f, from_version=since, to_version=to_version, node_id="chain-generator",
                             frame_bytes=frame_bytes, created_at_ms=T0 + to_version)
            w.add_many(records)
            assert h.version == to_version
            s = w.close(state_digest=h.digest & D.MASK)
        made.append(ChainFile(path, since, to_version, s.record_count, s.file_bytes, h.digest & D.MASK))
        since = s.last_version + 1
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory to write the chain into (created)")
    ap.add_argument("--messages", type=int, default=10_000_000, help="messages enqueued across the chain")
    ap.add_argument("--files", type=int, default=4, help="the full backup + files-1 incrementals")
    ap.add_argument("--value-bytes", type=int, default=100, help="content bytes per message")
    a = ap.parse_args()
    t0 = time.perf_counter()
    made = generate(a.dir, a.messages, a.files, value_bytes=a.value_bytes)
    dt = time.perf_counter() - t0
    for f in made:
        print(f"{f.path}: since {f.since}, to {f.to_version}, {f.records} records, {f.bytes / 1e6:.1f} MB")
    total = sum(f.records for f in made)
    print(f"{len(made)} files, {total} records, {sum(f.bytes for f in made) / 1e6:.1f} MB in {dt:.1f} s; "
          f"digest {D.hex_digest(made[-1].digest)}")


if __name__ == "__main__":
    main()
