"""Operational endpoints: `/livez`, `/readyz`, `/metrics`, `POST /db/backup`, `POST /db/restore`,
`GET /db/digest`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, BinaryIO

from fastapi import APIRouter, File, Request, UploadFile
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from doq.service import metrics
from doq.service.http import models as m
from doq.service.http.bodies import body_doc, errors, operation_id, read_json
from doq.service.http.lean import LeanRoute
from doq.service.redrive import RedriveCollector

if TYPE_CHECKING:
    from doq.service.api import QueueService

CHUNK = 256 * 1024


class Health(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": "ok", "reasons": []}]})
    status: str = Field(description="\"ok\", or \"failed\" (503) when the node can no longer make "
                                    "progress by itself.", examples=["ok"])
    reasons: list[str] = Field(description="Why it failed: `raft_failed` (the Raft loop stopped), "
                                           "`store_broken` (the store could not undo a failed write).")


class Readiness(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"ready": True, "leader": True, "leader_hint": "node-1", "reasons": []}]})
    ready: bool = Field(description="This node can serve: a member, in contact with the leader, applied "
                                    "up to the commit index it knew an election timeout ago.")
    leader: bool = Field(description="This node is the leader.")
    leader_hint: str = Field(description="The leader this node knows of (\"\" if none).")
    reasons: list[str] = Field(description=(
        "Why it is not ready ([] when ready): `not_a_member` (not in the configuration, e.g. a store "
        "not admitted yet), `no_leader`, `leader_unreachable` (no word from it for an election "
        "timeout), `applying` (behind the commit index it knew an election timeout ago), `shutting_down`, `starting`, `joining`, "
        "and the liveness reasons (`raft_failed`, `store_broken`)."))
    alarms: list[dict[str, str]] = Field(default_factory=list, description=(
        "Storage alarms on now (node_id, reason: DATA_SIZE_LIMIT | DISK_FREE_LIMIT | NOSPACE, "
        "message): this node's, and on the leader its members'. While any is on, writes that "
        "grow the state are refused with 507 / RESOURCE_EXHAUSTED; reads, dequeues, acks and "
        "deletes are served, so an alarm alone does not make the node unready."))


class BackupBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra={"examples": [{"since": 0}]})
    since: int = Field(ge=0, le=2**63 - 1, description="0: a full backup; last+1 (X-Last-Version of the previous one): the next incremental.")


class RestoreResultModel(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "success": True, "files": 1, "records": 125, "tombstones": 3, "to_version": 130, "last_version": 129}]})
    success: bool = True
    files: int = Field(description="Backup files restored (the full one, then incrementals).")
    records: int = Field(description="Records (queues, messages, ...) written.")
    tombstones: int = Field(description="Deletions applied.")
    to_version: int = Field(description="The state's version right after the restore (the chain's "
                                        "to_version, or the cluster's applied index if that was further); "
                                        "later writes get higher versions.")
    last_version: int = Field(description="Greatest record version restored.")


class DigestModel(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "digest": "5f0c" + "0" * 60, "applied_index": 130,
        "cluster_id": "0b6f7a3e-5c1d-4e8a-9f52-7d0c3a1e6b94"}]})
    digest: str = Field(description="The state digest (docs/backup.md): 64 hex digits, the sum modulo "
                                    "2**256 of SHA-256 of every live record. The same digest `doq verify` "
                                    "rebuilds from backup files.", pattern="^[0-9a-f]{64}$")
    applied_index: int = Field(description="The version of the state the digest belongs to (the to_version a "
                                           "backup taken at that point carries): the applied log index, plus the "
                                           "offset an online restore into a cluster may have added (docs/backup.md).")
    cluster_id: str = Field(description="The cluster the state belongs to (as in `GET /cluster` and in every "
                                        "backup's header; \"\" for a cluster bootstrapped before cluster ids).")


_ANSWERS = {
    "livez": "Live: the node can make progress by itself.",
    "readyz": "Ready: a member in contact with the leader, applied up to the commit index.",
    "restore": "Restored; the node serves the restored state.",
    "digest": "The digest of this node's committed state and the applied index it belongs to.",
}


def build_ops_router(api: QueueService) -> APIRouter:
    r = APIRouter(generate_unique_id_function=operation_id, route_class=LeanRoute)
    node = api.node
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.QueueDepthCollector(
        node.state.list_queues, lambda: bool(node.is_leader), api.long_polls.waiting,
        oldest_enqueued_ms=node.state.oldest_enqueued_ms, throttled_groups=node.state.throttled_groups))
    registry.register(metrics.AlarmCollector(node.alarms))
    registry.register(metrics.StorageCollector(node.storage_usage))
    registry.register(RedriveCollector(lambda: node.state.view))

    @r.get(
        "/livez", tags=["health"], response_model=Health, summary="Liveness",
        responses={503: {"description": "Failed: the node can no longer make progress by itself (restart it).",
                         "model": Health}},
    )
    async def livez() -> Response:
        """200 while the node can make progress by itself; 503 with the reasons once its
        Raft loop failed or its store broke (a supervisor should restart it)."""
        problems = node.liveness_problems()
        if not problems:
            return Response(b'{"status":"ok","reasons":[]}', media_type="application/json")
        return Response(m.dumps({"status": "failed", "reasons": problems}), status_code=503,
                        media_type="application/json")

    @r.get(
        "/readyz", tags=["health"], response_model=Readiness, summary="Readiness",
        responses={503: {"description": "Not ready: the reasons are in the body.", "model": Readiness}},
    )
    async def readyz() -> Response:
        """200 when this node can serve: a member of the configuration, in contact with the
        leader (or the leader), applied up to the commit index it knows; else 503 with the
        reasons. Storage alarms are listed but do not make the node unready."""
        problems = node.readiness_problems()
        body = {"ready": not problems, "leader": bool(node.is_leader), "leader_hint": node.leader_hint or "",
                "reasons": problems, "alarms": [a.as_dict() for a in node.alarms()]}
        return Response(m.dumps(body), status_code=503 if problems else 200, media_type="application/json")

    @r.get(
        "/metrics", tags=["health"], summary="Prometheus metrics",
        responses={200: {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}}},
        response_class=Response,
    )
    async def prometheus() -> Response:
        """Queue depths per queue and state, message counters, commit and fsync latency."""
        return Response(metrics.render(registry), media_type=CONTENT_TYPE_LATEST)

    _add_backup_routes(r, api)
    for route in r.routes:
        if isinstance(route, APIRoute) and route.name in _ANSWERS:
            route.response_description = _ANSWERS[route.name]
    return r


def _add_backup_routes(r: APIRouter, api: QueueService) -> None:
    from doq.backup import online as backup_online
    from doq.backup import ops as backup_ops

    node = api.node

    @r.post(
        "/db/backup", tags=["backup"], summary="Back up (full or incremental)",
        response_class=Response,
        responses={
            200: {
                "description": "The backup file (see docs/backup.md); header X-Last-Version.",
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                "headers": {"X-Last-Version": {
                    "description": "Greatest version in the file; the next incremental uses since = this + 1.",
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                }},
            },
            **errors(400, 413, 415, notes={400: "Invalid body, or `since` older than the tombstone horizon "
                                                "(SINCE_TOO_OLD: take a full backup)."}),
        },
        openapi_extra=body_doc(BackupBody),
    )
    async def backup(request: Request) -> Response:
        """Every record and tombstone with version >= `since`, from one consistent snapshot."""
        b = await read_json(request, BackupBody)
        await node.read_barrier()
        f, last, size = await asyncio.to_thread(
            backup_ops.backup_to_tempfile, node.state, b.since, node_id=node.node_id
        )
        return StreamingResponse(
            _iter_file(f), media_type="application/octet-stream",
            headers={"X-Last-Version": str(last), "Content-Length": str(size),
                     "Content-Disposition": f'attachment; filename="backup-{b.since}.bak"'},
        )

    @r.get("/db/digest", tags=["backup"], summary="State digest", response_model=DigestModel)
    async def digest() -> Response:
        """The digest of the whole committed state, from one consistent snapshot (one scan of
        every record, off the event loop; writes go on meanwhile)."""
        from doq.storage.digest import hex_digest

        await node.read_barrier()
        applied, d = await asyncio.to_thread(node.state.state_digest)
        return Response(m.dumps({"digest": hex_digest(d), "applied_index": applied,
                                 "cluster_id": node.state.cluster_id}),
                        media_type="application/json")

    @r.post(
        "/db/restore", tags=["backup"], summary="Restore (online)", response_model=RestoreResultModel,
        responses=errors(400, 409, 507, notes={
            400: "Not a doq backup, a corrupt file, files out of order (a gap in the chain), files of "
                 "different clusters (BACKUP_CLUSTER_MISMATCH), or files whose records do not form a valid "
                 "state (BACKUP_INCONSISTENT). Nothing was restored.",
            409: "The cluster's state is not empty (RESTORE_TARGET_NOT_EMPTY, also when a write raced the "
                 "restore; RESTORE_CLUSTER_MISMATCH when it is another cluster's state), or the restore's "
                 "chunks did not all reach the log (RESTORE_INCOMPLETE: the leader changed meanwhile). "
                 "Nothing was restored; retry.",
            503: "Not the leader and no leader to forward to, or leadership lost during the restore "
                 "(NOT_LEADER; `leader_hint` names the leader).",
        }),
    )
    async def restore(
        file: Annotated[list[UploadFile], File(description="Backup files in order: the full one, then incrementals.")],
    ) -> Response:
        """Restore full + incremental backups into the (empty) cluster, through the Raft log so
        every member restores the same state: all or nothing (a failed restore leaves every
        member as it was, so it can be retried). A follower forwards it to the leader."""
        res = await backup_online.restore_online(node, [u.file for u in file], [u.filename or f"file #{i + 1}" for i, u in enumerate(file)])
        return Response(m.dumps({
            "success": True, "files": res.files, "records": res.records, "tombstones": res.tombstones,
            "to_version": res.to_version, "last_version": res.last_version,
        }), media_type="application/json")


def _iter_file(f: BinaryIO) -> Iterator[bytes]:
    try:
        while chunk := f.read(CHUNK):
            yield chunk
    finally:
        f.close()
