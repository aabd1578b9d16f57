"""The replicated table of client keys (pure, deterministic: no clock, no randomness, no I/O).

A client key is a random secret the leader generates (`doq.auth.tokens`); the table holds
only its SHA-256 hash, beside the key's id, scopes and creation time (the leader's
`now_ms` of the batch that created it). `CreateKey` and `RevokeKey` are Raft commands:
every member applies them at the same log index, so every member authorizes alike.

Scopes (`parse_scope`): `admin`, `produce`, `consume`, `backup`, `restore`, `metrics`;
`produce` and `consume` may be limited to a queue-name prefix (`produce:orders.`).

Persistence: the state store keeps each key under the store key `STORE_PREFIX + id` in
its meta database (`doq.storage.state`): replicated (Raft snapshots carry every store
key), never a backup record (backups, `doq verify` and the state digest do not see
keys). `take_dirty()` hands the store what changed since the last call.

Rules (identical on every replica): an id is 1-64 characters of `KEY_ID_RE`; a key holds
1-`MAX_SCOPES` distinct valid scopes; a hash is 32 bytes; at most `MAX_KEYS` keys. A
create of an existing id fails (AlreadyExists), a revoke of an unknown id fails
(NotFound); revoking removes the key.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from doq.errors import AlreadyExists, InvalidArgument, NotFound
from doq.queues.limits import QUEUE_NAME_RE

SCOPE_NAMES = ("admin", "produce", "consume", "backup", "restore", "metrics")
PREFIXED = frozenset(("produce", "consume"))
KEY_ID_RE = re.compile(r"[a-z0-9]{1,64}")
HASH_BYTES = 32
MAX_SCOPES = 32
MAX_KEYS = 10_000
STORE_PREFIX = b"\x00apikey:"
_REC = struct.Struct("<BqH")  # record version, created_ms, scope count


class KeyNotFound(NotFound):
    default_reason = "KEY_NOT_FOUND"


@dataclass(frozen=True, slots=True)
class Scope:
    """One grant: `name` (one of SCOPE_NAMES) on queues starting with `prefix` ("" = all)."""

    name: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.name}:{self.prefix}" if self.prefix else self.name

    def allows(self, name: str, queue: str | None) -> bool:
        """Grants scope `name` on `queue` (None: the call names no queue, e.g. a list of
        queues: a prefix-limited scope grants it too)."""
        if self.name != name:
            return False
        return not self.prefix or queue is None or queue.startswith(self.prefix)


def parse_scope(text: str) -> Scope:
    """`admin`, `produce[:PREFIX]`, ... -> Scope; raises InvalidArgument (INVALID_SCOPE)."""
    if not isinstance(text, str):
        raise InvalidArgument("a scope must be a string", reason="INVALID_SCOPE")
    name, sep, prefix = text.partition(":")
    if name not in SCOPE_NAMES:
        raise InvalidArgument(f"unknown scope {text[:80]!r}: one of {', '.join(SCOPE_NAMES)} "
                              "(produce and consume may end in :PREFIX)", reason="INVALID_SCOPE")
    if sep and name not in PREFIXED:
        raise InvalidArgument(f"scope {name!r} takes no queue prefix", reason="INVALID_SCOPE")
    if sep and not QUEUE_NAME_RE.fullmatch(prefix):
        raise InvalidArgument(f"scope {text[:80]!r}: the prefix must be the start of a valid queue name",
                              reason="INVALID_SCOPE")
    return Scope(name, prefix)


def parse_scopes(texts: list[str] | tuple[str, ...]) -> tuple[Scope, ...]:
    """Distinct scopes in the given order; raises InvalidArgument if none, too many or bad."""
    if not 1 <= len(texts) <= MAX_SCOPES:
        raise InvalidArgument(f"a key needs 1-{MAX_SCOPES} scopes", reason="INVALID_SCOPE")
    out: list[Scope] = []
    for t in texts:
        s = parse_scope(t)
        if s not in out:
            out.append(s)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key as replicated: never the secret, only its hash."""

    id: str
    secret_hash: bytes
    scopes: tuple[Scope, ...]
    created_ms: int

    @property
    def scope_names(self) -> list[str]:
        return [str(s) for s in self.scopes]


def encode_record(rec: KeyRecord) -> bytes:
    parts = [_REC.pack(1, rec.created_ms, len(rec.scopes)), rec.secret_hash]
    for s in rec.scopes:
        raw = str(s).encode()
        parts.append(struct.pack("<H", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def decode_record(key_id: str, raw: bytes) -> KeyRecord:
    """Raises ValueError on a malformed record."""
    try:
        version, created, n = _REC.unpack_from(raw, 0)
        if version != 1:
            raise ValueError(f"unknown key record version {version}")
        pos = _REC.size
        h = raw[pos : pos + HASH_BYTES]
        pos += HASH_BYTES
        scopes = []
        for _ in range(n):
            (ln,) = struct.unpack_from("<H", raw, pos)
            pos += 2
            scopes.append(parse_scope(raw[pos : pos + ln].decode()))
            pos += ln
    except (struct.error, UnicodeDecodeError, InvalidArgument) as e:
        raise ValueError(f"malformed key record {key_id!r}: {e}") from None
    if len(h) != HASH_BYTES or pos != len(raw):
        raise ValueError(f"malformed key record {key_id!r}")
    return KeyRecord(key_id, h, tuple(scopes), created)


class KeyTable:
    """The keys by id. Only `create`/`revoke`/`load` mutate it (the single writer);
    readers on other threads use `snapshot()` (an immutable dict, replaced on change)."""

    def __init__(self) -> None:
        self._keys: dict[str, KeyRecord] = {}
        self._published: dict[str, KeyRecord] = {}
        self._dirty: dict[str, KeyRecord | None] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key_id: str) -> KeyRecord | None:
        return self._keys.get(key_id)

    def records(self) -> list[KeyRecord]:
        """Every key, by id."""
        return [self._keys[k] for k in sorted(self._keys)]

    def create(self, key_id: str, secret_hash: bytes, scopes: tuple[str, ...] | list[str], now_ms: int) -> KeyRecord:
        """Add a key (raises InvalidArgument, AlreadyExists; then nothing changes)."""
        if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
            raise InvalidArgument("a key id is 1-64 characters of a-z 0-9", reason="INVALID_KEY_ID")
        if not isinstance(secret_hash, bytes) or len(secret_hash) != HASH_BYTES:
            raise InvalidArgument(f"a key hash is {HASH_BYTES} bytes", reason="INVALID_KEY_HASH")
        parsed = parse_scopes(tuple(scopes))
        if key_id in self._keys:
            raise AlreadyExists(f"key {key_id} exists", reason="KEY_EXISTS")
        if len(self._keys) >= MAX_KEYS:
            raise InvalidArgument(f"at most {MAX_KEYS} keys", reason="TOO_MANY_KEYS")
        rec = KeyRecord(key_id, secret_hash, parsed, now_ms)
        self._keys[key_id] = rec
        self._dirty[key_id] = rec
        return rec

    def revoke(self, key_id: str) -> KeyRecord:
        """Remove a key; returns what it was (raises KeyNotFound)."""
        rec = self._keys.pop(key_id, None) if isinstance(key_id, str) else None
        if rec is None:
            raise KeyNotFound(f"no key {str(key_id)[:80]!r}")
        self._dirty[key_id] = None
        return rec

    def take_dirty(self) -> dict[str, KeyRecord | None]:
        """What changed since the last call (id -> record, or None if revoked), then reset."""
        dirty, self._dirty = self._dirty, {}
        return dirty

    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def load(self, records: list[KeyRecord]) -> None:
        """Replace the whole table (rebuild from storage)."""
        self._keys = {r.id: r for r in records}
        self._dirty = {}

    def publish(self) -> None:
        """Make the current table what `snapshot()` returns (the writer, after a commit)."""
        self._published = dict(self._keys)

    def snapshot(self) -> dict[str, KeyRecord]:
        """The last published table (never mutated afterwards: safe on any thread)."""
        return self._published
