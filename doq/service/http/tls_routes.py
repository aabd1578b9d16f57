"""Certificate routes of a secure node (`doq.service.tls_admin`; docs/security.md,
"Rotating certificates"). All need an admin key except `GET /cluster/tls` (any key),
and all act on the node addressed (a follower does not forward them to its leader:
`doq.service.http.forward`):

- `GET /cluster/tls`: this node's certificate, issuer, trusted CAs, signing CA, warnings;
- `POST /cluster/tls/renew {"signer"}`: this node gets a new key and certificate (signed
  by `signer`, default here or the leader), served from the next handshake on;
- `POST /cluster/tls/sign {"node_id", "csr"}` → `{"node_cert"}`: a member holding the CA
  key signs a member's renewal;
- `PUT /cluster/tls/trust {"bundle"}`: this node trusts exactly these CAs;
- `POST /cluster/tls/ca/begin` → `{"bundle", ...}`: (the CA holder) a next CA, trusted
  beside the current one, not signing yet;
- `POST /cluster/tls/ca/promote` → `{"ca_cert", ...}`: (the CA holder) the next CA signs;
- `POST /cluster/tls/reload`: take NODE_DIR/tls and --tls-cert/--tls-key as they are now.

Only on a secure node (these paths are 404 elsewhere).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from doq.node.member_input import NODE_ID_PATTERN
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.tls_admin import TlsAdmin

JSON = "application/json"


class SignBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    node_id: str = Field(pattern=NODE_ID_PATTERN, description="The member whose certificate this renews.")
    csr: str = Field(max_length=8192, description="A PEM certificate signing request for its new key (ECDSA P-256).")


class RenewBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    signer: str = Field("", pattern=f"^$|{NODE_ID_PATTERN}", description=(
        "The member that signs (it holds tls/ca.key); default: this node if it holds the "
        "signing CA key, else the leader."))


class TrustBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    bundle: str = Field(max_length=65536, description="PEM: the CA certificates this node trusts (1..8).")


def build_tls_router(admin: TlsAdmin) -> APIRouter:
    r = APIRouter(generate_unique_id_function=operation_id, route_class=LeanRoute)

    def ok(doc: object) -> Response:
        return Response(m.dumps(doc), media_type=JSON)

    @r.get("/cluster/tls", tags=["cluster"], summary="This node's certificates", responses=errors(401, 403))
    async def tls_status() -> Response:
        """This node's certificate (expiry, issuer), the CAs it trusts, the CA it signs
        with (if it holds a CA key), and warnings for what expires soon."""
        return ok(admin.status())

    @r.post("/cluster/tls/renew", tags=["cluster"], summary="Renew this node's certificate",
            responses=errors(400, 401, 403, 404, 409, 413, 415, 503),
            openapi_extra=body_doc(RenewBody, required=False))
    async def tls_renew(request: Request) -> Response:
        """A new key (made on this node) and a certificate for it from the signing CA,
        served from the next TLS handshake on: no restart."""
        b = await read_json(request, RenewBody, required=False)
        return ok(await admin.renew(request.headers.get("authorization", ""), b.signer))

    @r.post("/cluster/tls/sign", tags=["cluster"], summary="Sign a member's renewal",
            responses=errors(400, 401, 403, 404, 409, 413, 415), openapi_extra=body_doc(SignBody))
    async def tls_sign(request: Request) -> Response:
        """(A member holding the CA key.) A certificate for a member's new key, for exactly
        its node id and the hosts of its addresses."""
        b = await read_json(request, SignBody)
        return ok({"node_cert": (await admin.sign(b.node_id, b.csr.encode())).decode()})

    @r.put("/cluster/tls/trust", tags=["cluster"], summary="Set this node's trusted CAs",
           responses=errors(400, 401, 403, 409, 413, 415), openapi_extra=body_doc(TrustBody))
    async def tls_trust(request: Request) -> Response:
        """Trust exactly these CAs (peers, and the leader when forwarding). Refused (409
        TRUST_REFUSED, nothing changes) if this node's certificate or CA key is of none
        of them."""
        b = await read_json(request, TrustBody)
        return ok(await admin.set_trust(b.bundle.encode()))

    @r.post("/cluster/tls/ca/begin", tags=["cluster"], summary="Start a CA rotation here",
            responses=errors(401, 403, 409))
    async def tls_ca_begin() -> Response:
        """(The node holding the CA key.) A next CA (its key stays here), trusted beside the
        current one, which still signs; answers the bundle of both. Idempotent."""
        return ok(await admin.begin_ca())

    @r.post("/cluster/tls/ca/promote", tags=["cluster"], summary="Sign with the next CA",
            responses=errors(401, 403, 409))
    async def tls_ca_promote() -> Response:
        """(The node holding the CA key.) The next CA signs from now on; the old CA key is
        deleted."""
        return ok(await admin.promote_ca())

    @r.post("/cluster/tls/reload", tags=["cluster"], summary="Reload this node's TLS files",
            responses=errors(401, 403, 409))
    async def tls_reload() -> Response:
        """Take the files of this node's tls/ directory (and --tls-cert/--tls-key) as
        they are now, if they hold together (409 TLS_FILES otherwise; nothing changes)."""
        return ok(await admin.reload())

    return r
