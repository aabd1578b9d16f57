"""The key RPCs of doq.v1.DOQ (CreateKey, ListKeys, RevokeKey), mixed into its servicer."""

from __future__ import annotations

from typing import Any

import grpc
from doq_proto.v1 import doq_pb2 as pb

from doq.auth.admin import create_key, list_keys, revoke_key
from doq.errors import DoqError, status_of
from doq.node.base import Node
from doq.queues.apikeys import KeyRecord


def _pb(rec: KeyRecord) -> pb.ApiKey:
    return pb.ApiKey(id=rec.id, scopes=rec.scope_names, created_ms=rec.created_ms)


async def _abort(context: grpc.aio.ServicerContext, err: DoqError) -> None:
    context.set_trailing_metadata((("doq-reason", err.reason), ("doq-retryable", "true" if err.retryable else "false"),
                                   ("doq-leader", err.leader_hint)))
    await context.abort(grpc.StatusCode[status_of(err).grpc_code], err.message)


class KeyRpcs:
    """Mixin of the DOQ servicer: needs `self.node` (the node the keys live on)."""

    node: Node

    async def CreateKey(self, request: pb.CreateKeyRequest, context: Any) -> pb.CreateKeyResponse:
        try:
            created = await create_key(self.node, list(request.scopes))
        except DoqError as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e
        return pb.CreateKeyResponse(key_info=_pb(created.record), key=created.token)

    async def ListKeys(self, request: pb.ListKeysRequest, context: Any) -> pb.ListKeysResponse:
        try:
            keys = await list_keys(self.node)
        except DoqError as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e
        return pb.ListKeysResponse(keys=[_pb(k) for k in keys])

    async def RevokeKey(self, request: pb.RevokeKeyRequest, context: Any) -> pb.RevokeKeyResponse:
        try:
            await revoke_key(self.node, request.id)
        except DoqError as e:
            await _abort(context, e)
            raise AssertionError("unreachable") from e
        return pb.RevokeKeyResponse(success=True)
