"""Join tokens in the replicated state (doq/queues/join_tokens.py), pure: the codec round
trip of tags 20/21, one use per token, expiry on replicated time, a wrong secret refused,
only hashes stored (bound to the CA), kept beside the records (never one), a replica
rebuilt from the persisted table decides the same, and a `J` record of an older version
loads and is ignored."""

from __future__ import annotations

import hashlib
import struct

from doq.errors import DoqError, FailedPrecondition
from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import decode_batch, encode_batch
from doq.queues.join_tokens import TokenRecord, decode_record, encode_record
from doq.queues.machine import QueueMachine
from doq.queues.store import MemoryStore
from doq.tls.enrollment import secret_hash

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


def test_a_token_is_used_once_and_only_its_hash_is_kept_beside_the_records() -> None:
    store = MemoryStore()
    m = QueueMachine(store)
    assert run(m, c.CreateJoinToken(TID, HASH, T0 + 60_000), T0) is None
    dirty = m.join_tokens.take_dirty()
    assert dirty == {TID: TokenRecord(HASH, T0 + 60_000)}  # what the state store writes beside the keys
    assert SECRET not in encode_record(dirty[TID])
    assert not any(k[:1] == b"J" for k in store.data)  # never a record: no backup or digest sees it
    assert run(m, c.UseJoinToken(TID, HASH, "node-4"), T0 + 1) is None
    assert m.join_tokens.take_dirty() == {TID: None}
    again = run(m, c.UseJoinToken(TID, HASH, "node-5"), T0 + 2)
    assert isinstance(again, FailedPrecondition) and again.reason == "INVALID_JOIN_TOKEN"


def test_a_wrong_secret_or_an_expired_token_is_refused() -> None:
    m = QueueMachine(MemoryStore())
    run(m, c.CreateJoinToken(TID, HASH, T0 + 1000), T0)
    wrong = run(m, c.UseJoinToken(TID, hashlib.sha256(b"guess").digest(), "x"), T0 + 1)
    assert isinstance(wrong, DoqError)
    late = run(m, c.UseJoinToken(TID, HASH, "x"), T0 + 1000)
    assert isinstance(late, DoqError)


def test_creating_a_token_forgets_expired_ones_and_a_rebuilt_replica_agrees() -> None:
    m = QueueMachine(MemoryStore())
    run(m, c.CreateJoinToken(TID, HASH, T0 + 10), T0)
    other = b"u" * 16
    run(m, c.CreateJoinToken(other, HASH, T0 + 10_000), T0 + 20)
    assert sorted(m.join_tokens.tokens) == [other]
    persisted = {k: decode_record(encode_record(v)) for k, v in m.join_tokens.tokens.items()}
    rebuilt = QueueMachine(MemoryStore())
    rebuilt.join_tokens.load(persisted)
    rebuilt.now_ms = m.now_ms
    assert run(rebuilt, c.UseJoinToken(other, HASH, "n"), T0 + 30) is None
    assert isinstance(run(rebuilt, c.UseJoinToken(TID, HASH, "n"), T0 + 31), DoqError)


def test_a_record_of_an_older_version_loads_and_enrolls_nobody() -> None:
    """Join tokens used to be `J` records: a data dir or backup holding one still loads
    (the record is ignored), the machine's table stays as it was, and its token is refused."""
    m = QueueMachine(MemoryStore())
    run(m, c.CreateJoinToken(b"k" * 16, HASH, T0 + 60_000), T0)
    legacy = (K.join_token_key(TID), struct.pack(">Q32s", T0 + 60_000, HASH))
    m.load([legacy])
    assert sorted(m.join_tokens.tokens) == [b"k" * 16]  # load leaves the table to the store
    refused = run(m, c.UseJoinToken(TID, HASH, "n"), T0 + 1)
    assert isinstance(refused, FailedPrecondition) and refused.reason == "INVALID_JOIN_TOKEN"


def test_the_stored_hash_binds_the_secret_to_its_ca() -> None:
    fp_a, fp_b = "a" * 64, "b" * 64
    assert secret_hash(fp_a, SECRET) != secret_hash(fp_b, SECRET)
    assert secret_hash(fp_a, SECRET) != hashlib.sha256(SECRET).digest()
    m = QueueMachine(MemoryStore())
    run(m, c.CreateJoinToken(TID, secret_hash(fp_a, SECRET), T0 + 60_000), T0)
    assert isinstance(run(m, c.UseJoinToken(TID, secret_hash(fp_b, SECRET), "n"), T0 + 1), DoqError)
    assert run(m, c.UseJoinToken(TID, secret_hash(fp_a, SECRET), "n"), T0 + 2) is None


def test_a_token_id_already_in_use_is_refused_and_the_first_token_kept() -> None:
    m = QueueMachine(MemoryStore())
    assert run(m, c.CreateJoinToken(TID, HASH, T0 + 60_000), T0) is None
    other = hashlib.sha256(b"other").digest()
    again = run(m, c.CreateJoinToken(TID, other, T0 + 90_000), T0 + 1)
    assert isinstance(again, DoqError) and again.reason == "INVALID_JOIN_TOKEN"
    assert m.join_tokens.tokens[TID] == TokenRecord(HASH, T0 + 60_000)
