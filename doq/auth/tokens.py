"""Client key tokens: generated with `secrets`, stored only as SHA-256 hashes.

A token is `doq_<id>_<secret>`: `id` is 12 hex digits (48 random bits, the key's public
name in lists and audit lines), `secret` 43 URL-safe characters (256 random bits). The
replicated key table holds SHA-256(token), never the token. With 256 bits of randomness a
fast unsalted hash is enough: nothing short of guessing the secret finds a token from its
hash (a salt or slow hash defends low-entropy passwords, which these are not).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import NamedTuple

PREFIX = "doq_"
ID_HEX_DIGITS = 12
SECRET_BYTES = 32


class NewKey(NamedTuple):
    id: str
    token: str
    secret_hash: bytes


def new_key() -> NewKey:
    """A fresh random key (the token is shown once to whoever created it)."""
    key_id = secrets.token_hex(ID_HEX_DIGITS // 2)
    token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewKey(key_id, token, hash_of(token))


def hash_of(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def key_id_of(token: str) -> str | None:
    """The id a well-formed token names (None if malformed)."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or not secret or len(key_id) > 64 or len(token) > 256:
        return None
    return key_id


def matches(token: str, secret_hash: bytes) -> bool:
    """Does `token` hash to `secret_hash` (constant-time comparison)?"""
    return hmac.compare_digest(hash_of(token), secret_hash)


def bearer_token(authorization: str | bytes | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` value (None if absent or another scheme)."""
    if authorization is None:
        return None
    if isinstance(authorization, bytes):
        try:
            authorization = authorization.decode("ascii")
        except UnicodeDecodeError:
            return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
