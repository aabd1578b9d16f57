"""Join tokens in the replicated state (doq/queues/join_tokens.py), pure: the codec round
trip of tags 20/21, one use per token, expiry on replicated time, a wrong secret refused,
only hashes stored, and a replica rebuilt from the records decides the same."""

from __future__ import annotations

import hashlib

from doq.errors import DoqError, FailedPrecondition
from doq.queues import commands as c
from doq.queues.codec import decode_batch, encode_batch
from doq.queues.machine import QueueMachine
from doq.queues.store import MemoryStore

T0 = 1_700_000_000_000
TID, SECRET = b"t" * 16, b"s" * 32
HASH = hashlib.sha256(SECRET).digest()


def run(m: QueueMachine, cmd: c.Command, now: int, index: list[int] = [0]) -> object:  # noqa: B006 - a counter
    index[0] += 1
    return m.apply(index[0], c.CommandBatch(now, [cmd]))[0]


def test_join_token_commands_round_trip_with_tags_20_and_21() -> None:
    batch = c.CommandBatch(T0, [c.CreateJoinToken(TID, HASH, T0 + 5), c.UseJoinToken(TID, HASH, "node-4")])
    raw = encode_batch(batch)
    assert decode_batch(raw) == batch
    assert bytes([20]) + (16).to_bytes(4, "little") + TID in raw
    assert bytes([21]) + (16).to_bytes(4, "little") + TID in raw


def test_a_token_is_used_once_and_only_its_hash_is_stored() -> None:
    store = MemoryStore()
    m = QueueMachine(store)
    assert run(m, c.CreateJoinToken(TID, HASH, T0 + 60_000), T0) is None
    assert all(SECRET not in v for v in store.data.values()) and any(HASH in v for v in store.data.values())
    assert run(m, c.UseJoinToken(TID, HASH, "node-4"), T0 + 1) is None
    again = run(m, c.UseJoinToken(TID, HASH, "node-5"), T0 + 2)
    assert isinstance(again, FailedPrecondition) and again.reason == "INVALID_JOIN_TOKEN"
    assert not any(k[:1] == b"J" for k in store.data)


def test_a_wrong_secret_or_an_expired_token_is_refused() -> None:
    m = QueueMachine(MemoryStore())
    run(m, c.CreateJoinToken(TID, HASH, T0 + 1000), T0)
    wrong = run(m, c.UseJoinToken(TID, hashlib.sha256(b"guess").digest(), "x"), T0 + 1)
    assert isinstance(wrong, DoqError)
    late = run(m, c.UseJoinToken(TID, HASH, "x"), T0 + 1000)
    assert isinstance(late, DoqError)


def test_creating_a_token_forgets_expired_ones_and_a_rebuilt_replica_agrees() -> None:
    store = MemoryStore()
    m = QueueMachine(store)
    run(m, c.CreateJoinToken(TID, HASH, T0 + 10), T0)
    other = b"u" * 16
    run(m, c.CreateJoinToken(other, HASH, T0 + 10_000), T0 + 20)
    assert [k for k in store.data if k[:1] == b"J"] == [b"J" + other]
    rebuilt = QueueMachine(store)
    rebuilt.load(sorted(store.data.items()))
    rebuilt.now_ms = m.now_ms
    assert run(rebuilt, c.UseJoinToken(other, HASH, "n"), T0 + 30) is None
