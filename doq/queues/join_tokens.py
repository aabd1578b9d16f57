"""Join tokens in the replicated state (pure): what lets a new node enroll in a secure
cluster (docs/security.md, "Join tokens").

A token is created by `CreateJoinToken(token_id, secret_hash, expires_ms)` and spent by
`UseJoinToken(token_id, secret_hash, node_id)`: only the SHA-256 of its secret is stored
(record kind `J`, `doq.queues.keys.join_token_key`), so the state, its snapshots and its
backups never hold a secret. Use succeeds once, before `expires_ms` of replicated time,
with the right hash; it then deletes the token. Creating a token also forgets every
expired one. Every replica decides the same way at the same index.

Record: u64 BE expires_ms + 32-byte SHA-256 of the secret.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from doq.errors import FailedPrecondition, InvalidArgument
from doq.queues import commands as c
from doq.queues import keys as K

_REC = struct.Struct(">Q32s")
TOKEN_ID_BYTES = 16
HASH_BYTES = 32
MAX_TOKENS = 1024  # outstanding (unexpired, unused) tokens at most


@dataclass(slots=True)
class _Token:
    secret_hash: bytes
    expires_ms: int


class JoinTokens:
    """The outstanding join tokens, written through the machine's `Store`."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.tokens: dict[bytes, _Token] = {}

    def load_record(self, key: bytes, rec: bytes) -> None:
        expires_ms, digest = _REC.unpack(rec)
        self.tokens[key[1:]] = _Token(digest, expires_ms)

    def create(self, cmd: c.CreateJoinToken, now_ms: int) -> None:
        if len(cmd.token_id) != TOKEN_ID_BYTES or len(cmd.secret_hash) != HASH_BYTES:
            raise InvalidArgument("malformed join token", reason="INVALID_JOIN_TOKEN")
        self._forget_expired(now_ms)
        if len(self.tokens) >= MAX_TOKENS:
            raise InvalidArgument(f"too many outstanding join tokens (at most {MAX_TOKENS})",
                                  reason="TOO_MANY_JOIN_TOKENS")
        if cmd.token_id in self.tokens:
            raise InvalidArgument("join token id already in use", reason="INVALID_JOIN_TOKEN")
        self.tokens[cmd.token_id] = _Token(cmd.secret_hash, cmd.expires_ms)
        self.store.put(K.join_token_key(cmd.token_id), _REC.pack(cmd.expires_ms, cmd.secret_hash))  # type: ignore[attr-defined]

    def use(self, cmd: c.UseJoinToken, now_ms: int) -> None:
        tok = self.tokens.get(cmd.token_id)
        ok = (tok is not None and now_ms < tok.expires_ms
              and hmac.compare_digest(tok.secret_hash, cmd.secret_hash))
        if not ok:
            raise FailedPrecondition("the join token is unknown, used, expired or wrong",
                                   reason="INVALID_JOIN_TOKEN")
        del self.tokens[cmd.token_id]
        self.store.delete(K.join_token_key(cmd.token_id))  # type: ignore[attr-defined]

    def _forget_expired(self, now_ms: int) -> None:
        for tid in [t for t, tok in self.tokens.items() if tok.expires_ms <= now_ms]:
            del self.tokens[tid]
            self.store.delete(K.join_token_key(tid))  # type: ignore[attr-defined]
