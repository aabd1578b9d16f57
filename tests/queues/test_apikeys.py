"""The replicated key table (`doq.queues.apikeys`), its commands and codec: pure, no fakes needed."""

from __future__ import annotations

import hashlib

import pytest

from doq.errors import AlreadyExists, InvalidArgument
from doq.queues import commands as c
from doq.queues.apikeys import (
    KeyNotFound,
    KeyTable,
    Scope,
    decode_record,
    encode_record,
    parse_scope,
)
from doq.queues.codec import decode_batch, encode_batch
from doq.queues.machine import QueueMachine
from doq.queues.store import MemoryStore

H = hashlib.sha256(b"secret").digest()


@pytest.mark.parametrize("text, scope", [
    ("admin", Scope("admin")), ("produce", Scope("produce")), ("consume:orders.", Scope("consume", "orders.")),
    ("backup", Scope("backup")), ("restore", Scope("restore")), ("metrics", Scope("metrics")),
])
def test_valid_scopes_parse_and_print_back(text: str, scope: Scope) -> None:
    assert parse_scope(text) == scope
    assert str(scope) == text


@pytest.mark.parametrize("text", ["", "root", "admin:x", "metrics:q", "produce:", "produce:-bad", "consume:a b"])
def test_invalid_scopes_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_scope(text)


def test_a_prefix_scope_grants_only_its_queues_and_calls_naming_none() -> None:
    s = parse_scope("produce:orders.")
    assert s.allows("produce", "orders.eu")
    assert not s.allows("produce", "billing")
    assert not s.allows("consume", "orders.eu")
    assert s.allows("produce", None)


def test_create_and_revoke_change_the_table_and_report_what_to_persist() -> None:
    t = KeyTable()
    rec = t.create("k1", H, ["produce:a", "produce:a", "metrics"], 123)
    assert rec.scope_names == ["produce:a", "metrics"] and rec.created_ms == 123
    assert t.take_dirty() == {"k1": rec}
    assert t.snapshot() == {}  # readers see it once published (after the commit)
    t.publish()
    assert t.snapshot() == {"k1": rec}
    with pytest.raises(AlreadyExists):
        t.create("k1", H, ["admin"], 124)
    assert t.revoke("k1") == rec
    assert t.take_dirty() == {"k1": None}
    with pytest.raises(KeyNotFound):
        t.revoke("k1")


@pytest.mark.parametrize("key_id, h, scopes", [
    ("UPPER", H, ["admin"]), ("", H, ["admin"]), ("k" * 65, H, ["admin"]), ("k", b"short", ["admin"]),
    ("k", H, []), ("k", H, ["nope"]),
])
def test_a_bad_create_changes_nothing(key_id: str, h: bytes, scopes: list[str]) -> None:
    t = KeyTable()
    with pytest.raises(InvalidArgument):
        t.create(key_id, h, scopes, 1)
    assert len(t) == 0 and not t.has_dirty()


def test_records_round_trip() -> None:
    t = KeyTable()
    rec = t.create("abc123", H, ["consume:q.", "backup"], 99)
    assert decode_record("abc123", encode_record(rec)) == rec
    with pytest.raises(ValueError):
        decode_record("abc123", encode_record(rec) + b"x")


def test_key_commands_round_trip_through_the_codec() -> None:
    batch = c.CommandBatch(5, [c.CreateKey("k1", H, ("admin", "produce:x")), c.RevokeKey("k1"), c.Tick()])
    assert decode_batch(encode_batch(batch)) == batch


def test_the_machine_applies_key_commands_at_the_batch_time_and_returns_errors() -> None:
    m = QueueMachine(MemoryStore())
    res = m.apply(1, c.CommandBatch(1000, [c.CreateKey("k1", H, ("admin",)), c.CreateKey("k1", H, ("admin",)),
                                           c.RevokeKey("nokey")]))
    assert res[0].created_ms == 1000  # type: ignore[attr-defined]
    assert isinstance(res[1], AlreadyExists) and isinstance(res[2], KeyNotFound)
    assert [r.id for r in m.keys.records()] == ["k1"]


def test_a_key_record_of_an_unknown_version_is_refused_naming_the_version() -> None:
    """A record written by a newer doq (another version byte) is not misread."""
    raw = bytearray(encode_record(KeyTable().create("abc123", H, ["backup"], 99)))
    raw[0] = 2
    with pytest.raises(ValueError, match="unknown key record version 2"):
        decode_record("abc123", bytes(raw))
