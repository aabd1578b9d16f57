"""Key administration over a node: create (the leader generates the secret), list, revoke.

`create` validates the scopes first (InvalidArgument, nothing proposed), generates a key
(`doq.auth.tokens.new_key`) and proposes `CreateKey` with the secret's hash only; the
token is returned to the caller once and kept nowhere. `revoke` proposes `RevokeKey`.
Both go through the log (a follower's node raises NotLeader; the doors relay to the
leader). `list` reads the committed table after a read barrier (linearizable).
"""

from __future__ import annotations

from typing import NamedTuple

from doq.auth import tokens
from doq.errors import DoqError
from doq.node.base import Node
from doq.queues.apikeys import KeyRecord, parse_scopes
from doq.queues.commands import CreateKey, RevokeKey


class CreatedKey(NamedTuple):
    record: KeyRecord
    token: str


async def create_key(node: Node, scopes: list[str] | tuple[str, ...], *,
                     key: tokens.NewKey | None = None) -> CreatedKey:
    """Create a key with `scopes` (a fresh one, or `key` when the caller generated it)."""
    parsed = parse_scopes(tuple(scopes))
    new = key or tokens.new_key()
    res = await node.propose(CreateKey(new.id, new.secret_hash, tuple(str(s) for s in parsed)))
    if isinstance(res, DoqError):
        raise res
    assert isinstance(res, KeyRecord)
    return CreatedKey(res, new.token)


async def revoke_key(node: Node, key_id: str) -> KeyRecord:
    res = await node.propose(RevokeKey(key_id))
    if isinstance(res, DoqError):
        raise res
    assert isinstance(res, KeyRecord)
    return res


async def list_keys(node: Node) -> list[KeyRecord]:
    await node.read_barrier()
    keys = node.state.keys()
    return [keys[k] for k in sorted(keys)]


def key_json(rec: KeyRecord) -> dict[str, object]:
    """A key as users see it (never its hash)."""
    return {"id": rec.id, "scopes": rec.scope_names, "created_ms": rec.created_ms}
