"""Join tokens in the replicated state (pure): what lets a new node enroll in a secure
cluster (docs/security.md, "Join tokens").

A token is created by `CreateJoinToken(token_id, secret_hash, expires_ms)` and spent by
`UseJoinToken(token_id, secret_hash, node_id)`: only a hash of its secret is stored
(`doq.tls.enrollment.secret_hash`: SHA-256 over the CA fingerprint and the secret), so
the state and its snapshots never hold a secret. Use succeeds once, before `expires_ms`
of replicated time, with the right hash; it then deletes the token. Creating a token also
forgets every expired one. Every replica decides the same way at the same index.

Like the client keys (`doq.queues.apikeys`), the table is access control, not queue
data: the state store keeps each token under the store key `STORE_PREFIX + token id` in
its meta database (replicated: Raft snapshots carry every store key), never as a record
(backups, `doq verify`, the state digest and a restore never see tokens; a restore leaves
the target's tokens as they are). `take_dirty()` hands the store what changed; readers on
other threads (the enrollment's check before it proposes anything) use `snapshot()`.

Record: u64 BE expires_ms + 32-byte hash.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from doq.errors import FailedPrecondition, InvalidArgument
from doq.queues import commands as c

_REC = struct.Struct(">Q32s")
TOKEN_ID_BYTES = 16
HASH_BYTES = 32
MAX_TOKENS = 1024  # outstanding (unexpired, unused) tokens at most
STORE_PREFIX = b"\x00jointoken:"


@dataclass(frozen=True, slots=True)
class TokenRecord:
    secret_hash: bytes
    expires_ms: int


def encode_record(t: TokenRecord) -> bytes:
    return _REC.pack(t.expires_ms, t.secret_hash)


def decode_record(raw: bytes) -> TokenRecord:
    """Raises ValueError on a malformed record."""
    try:
        expires_ms, digest = _REC.unpack(raw)
    except struct.error as e:
        raise ValueError(f"malformed join token record: {e}") from None
    return TokenRecord(digest, expires_ms)


def accepts(tok: TokenRecord | None, secret_hash: bytes, now_ms: int) -> bool:
    """Would a use of `tok` with `secret_hash` at `now_ms` succeed? (constant-time compare)"""
    return (tok is not None and now_ms < tok.expires_ms
            and hmac.compare_digest(tok.secret_hash, secret_hash))


class JoinTokens:
    """The outstanding join tokens by id. Only `create`/`use`/`load` mutate it (the single
    writer); readers on other threads use `snapshot()` (replaced on `publish`)."""

    def __init__(self) -> None:
        self.tokens: dict[bytes, TokenRecord] = {}
        self._published: dict[bytes, TokenRecord] = {}
        self._dirty: dict[bytes, TokenRecord | None] = {}

    def create(self, cmd: c.CreateJoinToken, now_ms: int) -> None:
        if len(cmd.token_id) != TOKEN_ID_BYTES or len(cmd.secret_hash) != HASH_BYTES:
            raise InvalidArgument("malformed join token", reason="INVALID_JOIN_TOKEN")
        self._forget_expired(now_ms)
        if len(self.tokens) >= MAX_TOKENS:
            raise InvalidArgument(f"too many outstanding join tokens (at most {MAX_TOKENS})",
                                  reason="TOO_MANY_JOIN_TOKENS")
        if cmd.token_id in self.tokens:
            raise InvalidArgument("join token id already in use", reason="INVALID_JOIN_TOKEN")
        rec = TokenRecord(cmd.secret_hash, cmd.expires_ms)
        self.tokens[cmd.token_id] = rec
        self._dirty[cmd.token_id] = rec

    def use(self, cmd: c.UseJoinToken, now_ms: int) -> None:
        if not accepts(self.tokens.get(cmd.token_id), cmd.secret_hash, now_ms):
            raise FailedPrecondition("the join token is unknown, used, expired or wrong",
                                     reason="INVALID_JOIN_TOKEN")
        del self.tokens[cmd.token_id]
        self._dirty[cmd.token_id] = None

    def _forget_expired(self, now_ms: int) -> None:
        for tid in [t for t, tok in self.tokens.items() if tok.expires_ms <= now_ms]:
            del self.tokens[tid]
            self._dirty[tid] = None

    def take_dirty(self) -> dict[bytes, TokenRecord | None]:
        """What changed since the last call (id -> record, or None if gone), then reset."""
        dirty, self._dirty = self._dirty, {}
        return dirty

    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def load(self, records: dict[bytes, TokenRecord]) -> None:
        """Replace the whole table (rebuild from storage)."""
        self.tokens = dict(records)
        self._dirty = {}

    def publish(self) -> None:
        """Make the current table what `snapshot()` returns (the writer, after a commit)."""
        self._published = dict(self.tokens)

    def snapshot(self) -> dict[bytes, TokenRecord]:
        """The last published table (never mutated afterwards: safe on any thread)."""
        return self._published
