"""`/API/v1/keys`: create, list and revoke client keys over HTTP (admin scope, see the table)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from starlette.responses import Response

from doq.auth.admin import create_key, key_json, list_keys, revoke_key
from doq.node.base import Node
from doq.queues import limits as L
from doq.queues.apikeys import MAX_SCOPES, PREFIXED, SCOPE_NAMES
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute

# what `doq.queues.apikeys.parse_scope` accepts (documented; it refuses the rest, INVALID_SCOPE)
SCOPE_PATTERN = (f"^({'|'.join(n for n in SCOPE_NAMES if n not in PREFIXED)}|({'|'.join(sorted(PREFIXED))})"
                 f"(:{L.QUEUE_NAME_PATTERN.strip('^$')})?)$")


class CreateKeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"scopes": ["produce:orders."]}]})
    scopes: list[Annotated[str, WithJsonSchema({"type": "string", "pattern": SCOPE_PATTERN})]] = Field(
                              min_length=1, max_length=MAX_SCOPES,
                              description="`admin`, `produce[:PREFIX]`, `consume[:PREFIX]`, `backup`, `restore`, "
                                          "`metrics`.")


class KeyModel(BaseModel):
    id: str = Field(description="The key's id (public: lists, audit lines).")
    scopes: list[str]
    created_ms: int = Field(description="Creation time (the leader's clock), ms since the epoch.")


class CreatedKeyModel(KeyModel):
    key: str = Field(description="The key itself: shown this once, stored only as a hash.")


class KeyList(BaseModel):
    keys: list[KeyModel]


KeyId = Annotated[str, Path(description="The key's id.", json_schema_extra={"pattern": "^[a-z0-9]{1,64}$"})]
JSON = "application/json"


def build_keys_router(node: Node) -> APIRouter:
    r = APIRouter(generate_unique_id_function=operation_id, route_class=LeanRoute)

    @r.post("/API/v1/keys", tags=["keys"], status_code=201, response_model=CreatedKeyModel, summary="Create a key",
            response_description="The new key (its `key` shown this once).",
            responses=errors(400, 401, 403, 415), openapi_extra=body_doc(CreateKeyBody))
    async def create_api_key(request: Request) -> Response:
        """A new random key with these scopes; the answer holds the key, shown this once."""
        b = await read_json(request, CreateKeyBody)
        created = await create_key(node, b.scopes)
        return Response(m.dumps({**key_json(created.record), "key": created.token}), status_code=201, media_type=JSON)

    @r.get("/API/v1/keys", tags=["keys"], response_model=KeyList, summary="List keys",
           response_description="Every key, by id.",
           responses=errors(401, 403))
    async def list_api_keys() -> Response:
        """Every key's id, scopes and creation time (never the key)."""
        return Response(m.dumps({"keys": [key_json(k) for k in await list_keys(node)]}), media_type=JSON)

    @r.delete("/API/v1/keys/{key_id}", tags=["keys"], summary="Revoke a key", response_description="Revoked.",
              responses=errors(401, 403, 404))
    async def revoke_api_key(key_id: KeyId) -> Response:
        """Remove the key: every member refuses it once it applies the revocation."""
        await revoke_key(node, key_id)
        return Response(b'{"success":true}', media_type=JSON)

    return r
