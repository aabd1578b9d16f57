"""`doq serve`: one process, one event loop, gRPC + HTTP over one service facade."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import lmdb

from doq.auth.authorizer import Authorizer
from doq.auth.bootstrap import ensure_admin_key
from doq.auth.grpc_door import AuditInterceptor, AuthInterceptor
from doq.auth.mode import keys_required
from doq.config import ServeConfig
from doq.node import k8s_leader
from doq.node.base import Node
from doq.service.api import QueueService
from doq.service.grpc_forward import LeaderForwarder
from doq.service.grpc_server import build_server, grpc_frame_limit, set_serving
from doq.service.limits import Limits
from doq.storage.dirlock import NodeDirInUse, NodeDirLock
from doq.storage.env import node_dir, open_env
from doq.storage.state import StateStore

log = logging.getLogger("doq.server")


class StartupError(Exception):
    """The node cannot start (bad data dir, port in use...): message for the operator."""


@dataclass
class Runtime:
    """Everything a running node holds; built by `open_runtime`, closed by `close`."""

    config: ServeConfig
    lock: NodeDirLock
    env: lmdb.Environment
    state: StateStore
    node: Node
    api: QueueService

    def close(self, *, discard: bool = False) -> None:
        """Close storage and release the node directory; `discard` (a failed start) also
        removes the directories this start created."""
        self.env.close()
        self.lock.release(discard=discard)


def lock_node_dir(config: ServeConfig) -> NodeDirLock:
    """Take the node directory for this process (one process per node directory)."""
    path = node_dir(config.data_dir, config.node_id)
    try:
        return NodeDirLock.acquire(path)
    except NodeDirInUse as e:
        raise StartupError(str(e)) from e
    except OSError as e:
        raise StartupError(f"cannot open data dir {path}: {e}") from e


async def open_runtime(config: ServeConfig) -> Runtime:
    """Lock the node directory, open storage, rebuild state and build the Raft node (after
    joining the cluster, for a new node with `--join`) and the facade (not started).
    Raises StartupError, having left the disk as it was."""
    lock = lock_node_dir(config)
    path = lock.path / "doq.lmdb"
    try:
        env = open_env(path)
    except (OSError, lmdb.Error) as e:
        lock.release(discard=True)
        raise StartupError(f"cannot open data dir {path}: {e}") from e
    try:
        state = StateStore(env)
        from doq.cluster_client import ClusterError, join_cluster
        from doq.node.build import open_raft_node
        from doq.node.raft_node import RaftNodeConfig
        from doq.node.transport import GrpcRaftTransport
        from doq.service import metrics

        raft_config = RaftNodeConfig(election_tick=config.election_timeout_ms // RaftNodeConfig().tick_ms,
                                     snapshot_every=config.snapshot_every, keep_entries=config.keep_entries,
                                     restore_chunk_bytes=config.restore_chunk_bytes)
        try:
            node = await open_raft_node(
                state, node_id=config.node_id, addrs=config.member_addrs(), join_addrs=config.join,
                join_cluster=join_cluster, on_commit=metrics.observe_commit, config=raft_config,
                transport=lambda on_messages: GrpcRaftTransport(config.node_id, config.raft_addr, on_messages),
            )
        except ClusterError as e:
            raise StartupError(f"cannot join the cluster at {', '.join(config.join)}: {e}") from e
        api = QueueService(node, Limits(max_message_bytes=config.max_message_bytes))
    except BaseException:
        env.close()
        lock.release()
        raise
    return Runtime(config, lock, env, state, node, api)


class _QuietUvicornServer:
    """uvicorn.Server without its own signal handling (the node handles SIGTERM)."""

    @staticmethod
    def make(app: object, host: str, port: int, log_level: str):  # type: ignore[no-untyped-def]
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        cfg = uvicorn.Config(
            app,  # type: ignore[arg-type]
            host=host,
            port=port,
            log_level="warning" if log_level == "info" else log_level,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        return Server(cfg)


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class _Listeners:
    grpc_server: grpc.aio.Server
    grpc_port: int
    forwarder: LeaderForwarder | None  # gRPC follower forwarding (a clustered node)
    http: Any  # the uvicorn server
    http_task: asyncio.Task[None]


async def _listen(rt: Runtime, authz: Authorizer) -> _Listeners:
    """Start the gRPC server and the HTTP gateway; raises StartupError with neither running."""
    config = rt.config
    forwarder = None
    if rt.node.cluster_admin() is not None:
        forwarder = LeaderForwarder(rt.node, max_message_bytes=grpc_frame_limit(config.max_message_bytes))
    # the client door: keys checked first; admin actions audited where they are served
    interceptors = [AuthInterceptor(authz), *([forwarder] if forwarder else []), AuditInterceptor(authz, config.node_id)]
    try:
        grpc_server, grpc_port = build_server(rt.api, config.grpc_addr, max_message_bytes=config.max_message_bytes,
                                              interceptors=interceptors)
    except (OSError, RuntimeError) as e:
        raise StartupError(f"cannot listen on gRPC address {config.grpc_addr}: {e}") from e
    await grpc_server.start()
    await set_serving(grpc_server, True)

    from doq.service.http_gateway import create_app

    host, port = _split(config.http_addr)
    http = _QuietUvicornServer.make(create_app(rt.api, authz), host, port, config.log_level)

    async def serve_http() -> None:
        try:
            await http.serve()
        except SystemExit:  # uvicorn's answer to a failed bind (it logs the reason)
            return

    http_task = asyncio.create_task(serve_http())
    while not http.started:
        if http_task.done():
            await grpc_server.stop(0)
            if forwarder:
                await forwarder.close()
            raise StartupError(f"cannot listen on HTTP address {config.http_addr}")
        await asyncio.sleep(0.01)
    return _Listeners(grpc_server, grpc_port, forwarder, http, http_task)


async def serve(config: ServeConfig, *, ready: asyncio.Event | None = None) -> None:
    """Run a node until SIGTERM/SIGINT, then shut down gracefully.

    Raises StartupError if the node cannot start (its directory held by another process,
    storage unusable, an address in use); a failed start leaves no directory behind that
    did not exist before it.
    """
    try:
        leader_label = k8s_leader.from_env()  # None unless DOQ_K8S_LEADER_LABEL is set
    except k8s_leader.K8sConfigError as e:
        raise StartupError(str(e)) from None
    rt = await open_runtime(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await rt.node.start()
    except Exception as e:  # e.g. the Raft address is in use
        with contextlib.suppress(Exception):
            await rt.node.stop()
        rt.close(discard=True)
        raise StartupError(f"cannot start the node (Raft address {config.raft_addr}): {e}") from e
    authz = Authorizer(rt.state.keys, required=keys_required(config))
    try:
        listeners = await _listen(rt, authz)
    except StartupError:
        await rt.node.stop()
        rt.close(discard=True)
        raise
    admin_key = asyncio.create_task(ensure_admin_key(rt.node, config.data_dir)) if authz.required else None
    log.info(
        "doq node %s serving gRPC on %s (port %d), HTTP on %s; data in %s",
        config.node_id, config.grpc_addr, listeners.grpc_port, config.http_addr, config.data_dir,
    )
    # Everything built so far (modules, schemas, the rebuilt queue indexes) lives as long as
    # the process: keep it out of the cyclic GC's full collections, which otherwise scan it
    # again and again while the heap grows (measured: ~27 % of the wall time of an HTTP
    # enqueue load in gen-2 pauses). O(1); refcounting still frees these objects.
    gc.freeze()
    if leader_label:
        leader_label.follow(lambda: rt.node.is_leader)
    print(f"doq: node {config.node_id} ready: grpc={config.grpc_addr} http={config.http_addr}", flush=True)
    if ready:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    if admin_key is not None:
        admin_key.cancel()
        with contextlib.suppress(BaseException):
            await admin_key
    # Stop taking new work, let in-flight calls finish, commit what was taken, then close
    # (a leader first hands leadership to the most up-to-date follower).
    await set_serving(listeners.grpc_server, False)
    listeners.http.should_exit = True
    grpc_stop = asyncio.create_task(listeners.grpc_server.stop(grace=5))
    await rt.node.stop()
    if leader_label:
        await leader_label.aclose()
    await grpc_stop
    if listeners.forwarder:
        await listeners.forwarder.close()
    await listeners.http_task
    rt.close()
    log.info("stopped")
