"""`doq serve`: one process, one event loop, gRPC + HTTP over one service facade."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import lmdb

from doq.auth.authorizer import Authorizer
from doq.auth.bootstrap import ensure_admin_key, read_admin_key_file
from doq.auth.grpc_door import AuditInterceptor, AuthInterceptor
from doq.auth.mode import keys_required
from doq.config import ServeConfig
from doq.errors import InvalidArgument
from doq.node import alarms, k8s_leader
from doq.node.base import Node
from doq.node.cluster import ClusterStatus
from doq.server_tls import ServingTls, config_hosts, enroll_node, needs_enrollment, node_tls
from doq.service.api import QueueService
from doq.service.grpc_forward import LeaderForwarder
from doq.service.grpc_server import build_server, grpc_frame_limit, set_serving
from doq.service.limits import Limits
from doq.service.rate_history import RateHistory, run_sampler
from doq.service.startup_http import StartupResponder
from doq.storage.dirlock import NodeDirInUse, NodeDirLock
from doq.storage.env import node_dir, open_env
from doq.storage.files import DIR_MODE, tighten
from doq.storage.state import StateStore
from doq.tls.certs import TlsSetupError
from doq.tls.creds import ca_channel_credentials, ssl_client_context
from doq.tls.mode import host_of, is_loopback

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
    tls: ServingTls | None = None  # a secure node's (doq/tls)
    rate_history: RateHistory = field(default_factory=RateHistory)  # the dashboard's charts

    def close(self, *, discard: bool = False) -> None:
        """Close storage and release the node directory; `discard` (a failed start) also
        removes the directories this start created."""
        self.env.close()
        self.lock.release(discard=discard)


def node_limits(config: ServeConfig) -> Limits:
    """The node's one settings object of request and stream bounds (the facade's door
    applies it), from `doq serve`'s settings."""
    return Limits(
        max_message_bytes=config.max_message_bytes, max_stream_prefetch=config.max_stream_prefetch,
        max_stream_pending_acks=config.max_stream_pending_acks, max_connections=config.max_connections,
        max_calls=config.max_calls, max_calls_per_key=config.max_calls_per_key,
        max_header_bytes=config.max_header_bytes, max_headers=config.max_headers,
        read_timeout_ms=config.read_timeout_ms, keep_alive_ms=config.keep_alive_ms,
        max_restore_bytes=config.max_restore_size, max_queues=config.max_queues)


def lock_node_dir(config: ServeConfig) -> NodeDirLock:
    """Take the node directory for this process (one process per node directory)."""
    path = node_dir(config.data_dir, config.node_id)
    try:
        if path.parent.exists():  # the data dir (it may hold several nodes): private too
            with contextlib.suppress(PermissionError):  # not ours: its node dirs still are
                tighten(path.parent, DIR_MODE)
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
        env = open_env(path, map_size=alarms.map_size(config.max_data_size))
        gauge = alarms.StorageGauge(env, path, node_id=config.node_id, max_data_bytes=config.max_data_size,
                                    disk_free_limit_bytes=config.disk_free_limit)
    except (OSError, lmdb.Error) as e:
        lock.release(discard=True)
        raise StartupError(f"cannot open data dir {path}: {e}") from e
    enrolled = None  # the cluster's status, when this start enrolled with a join token
    try:
        if needs_enrollment(config, lock.path):
            enrolled = await _enroll(config, env, lock.path)
        tls = node_tls(config, lock.path)
    except (TlsSetupError, InvalidArgument) as e:
        env.close()
        lock.release(discard=True)
        raise StartupError(str(e)) from None
    try:
        state = StateStore(env, parallel_load_min=config.parallel_load_min or None,  # nothing else writes
                           meanwhile=_import_serving_modules)
        from doq.cluster_client import ClusterError, join_cluster
        from doq.node.build import ClusterMismatch, open_raft_node
        from doq.node.raft_node import RaftNodeConfig
        from doq.service import metrics

        raft_config = RaftNodeConfig(election_tick=config.election_timeout_ms // RaftNodeConfig().tick_ms,
                                     snapshot_every=config.snapshot_every, keep_entries=config.keep_entries,
                                     restore_chunk_bytes=config.restore_chunk_bytes,
                                     apply_thread=config.apply_thread, hold_commit_ms=config.hold_commit_ms)
        join = join_cluster
        if enrolled is not None:  # already added by the enrollment
            join = lambda *_, **__: enrolled  # noqa: E731
        elif tls is not None:  # join over HTTPS, verified with the cluster CA
            join = functools.partial(join_cluster, ssl_context=ssl_client_context(ca_pem=tls.node.ca_cert))
        responder = await _hold_http_while_joining(config, state, tls)
        try:
            node = await open_raft_node(
                state, node_id=config.node_id, addrs=config.member_addrs(), join_addrs=config.join,
                join_cluster=join, cluster_id=config.cluster_id, on_applied=metrics.observe_applied, on_commit=metrics.observe_commit,
                config=raft_config, gauge=gauge,
                transport=lambda on_messages: _transport(config, on_messages, tls),
            )
        except ClusterError as e:
            raise StartupError(f"cannot join the cluster at {', '.join(config.join)}: {e}") from e
        except ClusterMismatch as e:
            raise StartupError(str(e)) from e
        finally:
            if responder is not None:
                await responder.stop()
        api = QueueService(node, node_limits(config))
    except BaseException:
        env.close()
        lock.release()
        raise
    return Runtime(config, lock, env, state, node, api, tls)


def _import_serving_modules() -> None:
    """Import the modules a start needs once its state is loaded (the Raft node, the
    listeners; ~1 s of CPU): `StateStore` calls it while a load on two processes waits
    for its second one, so that this CPU does them while the other still loads."""
    import uvicorn  # noqa: F401

    import doq.cluster_client  # noqa: F401
    import doq.node.build  # noqa: F401
    import doq.node.raft_node  # noqa: F401
    import doq.node.transport  # noqa: F401
    import doq.service.http.protocol  # noqa: F401
    import doq.service.http_gateway  # noqa: F401
    import doq.service.metrics  # noqa: F401


def _transport(config: ServeConfig, on_messages: Any, tls: ServingTls | None) -> Any:
    """The Raft transport (asyncio TCP streams); a secure node's is mutual TLS following its
    live TLS material (doq.tls.live)."""
    from doq.node.transport import TcpRaftTransport

    t = TcpRaftTransport(config.node_id, config.raft_addr, on_messages, tls=tls.live if tls else None)
    return t


async def _enroll(config: ServeConfig, env: lmdb.Environment, node_path: Path) -> ClusterStatus:
    """Enroll with the join token under this store's identity (as `open_raft_node` joins:
    the store id, whether it is empty, the cluster it means), so the leader's conf change
    admits this store and the node may vote once it holds it (`doq.node.store_identity`)."""
    from doq.node import store_identity
    from doq.node.build import has_raft_data

    empty = not has_raft_data(env)
    ident = store_identity.ensure(env, empty_join=empty)
    cluster_id = config.cluster_id or ident.cluster_id
    return await asyncio.to_thread(enroll_node, config, node_path, store_id=ident.store_id, empty=empty,
                                   cluster_id=cluster_id)


async def _hold_http_while_joining(config: ServeConfig, state: StateStore,
                                   tls: ServingTls | None) -> StartupResponder | None:
    """A node whose empty store joins a cluster answers its identity, /livez and /readyz
    (not ready) on its HTTP address while it waits (`doq.service.startup_http`); None for
    any other start (its gateway follows at once)."""
    from doq.node import store_identity
    from doq.node.build import has_raft_data
    from doq.node.cluster import NodeIdentity

    if not config.join or has_raft_data(state.env):
        return None
    ident = store_identity.ensure(state.env, empty_join=True)
    cluster_id = state.cluster_id or ident.cluster_id
    responder = StartupResponder(NodeIdentity(config.node_id, ident.store_id, cluster_id, empty=not cluster_id),
                                 "joining")
    host, port = _split(config.http_addr)
    ssl_context = None
    if tls is not None:  # HTTPS only, as the gateway that follows
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(tls.cert_file, tls.key_file)
    try:
        return await responder.start(host, port, ssl_context)
    except OSError as e:
        raise StartupError(f"cannot listen on HTTP address {config.http_addr}: {e}") from e


def _client_pair_files(tls: ServingTls) -> tuple[str, str]:
    return str(tls.cert_file), str(tls.key_file)


class _QuietUvicornServer:
    """uvicorn.Server without its own signal handling (the node handles SIGTERM), bounded by
    the node's `Limits`: uvicorn's own connection count and keep-alive settings, and the
    header and read bounds of `doq.service.http.protocol`."""

    @staticmethod
    def make(app: object, host: str, port: int, log_level: str, limits: Limits,  # type: ignore[no-untyped-def]
             tls: ServingTls | None = None):
        import uvicorn

        from doq.service.http.protocol import bounded_protocol

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
            ssl_certfile=str(tls.cert_file) if tls else None,
            ssl_keyfile=str(tls.key_file) if tls else None,
            http=bounded_protocol(max_header_bytes=limits.max_header_bytes, max_headers=limits.max_headers,
                                  read_timeout_s=limits.read_timeout_ms / 1000),
            limit_concurrency=limits.max_connections,
            timeout_keep_alive=limits.keep_alive_ms / 1000,  # type: ignore[arg-type]  # a float works
        )
        if tls is not None:  # a renewed certificate is served from the next handshake on (doq.tls.live)
            cfg.load()
            ssl_ctx = cfg.ssl
            assert ssl_ctx is not None
            tls.live.subscribe(lambda _m: ssl_ctx.load_cert_chain(*_client_pair_files(tls)))
        return Server(cfg)


def _forward_ssl(tls: ServingTls) -> Callable[[], ssl.SSLContext]:
    """The follower's HTTPS context to its leader, for the current trust bundle."""
    made: dict[int, ssl.SSLContext] = {}

    def context() -> ssl.SSLContext:
        gen = tls.live.generation
        if gen not in made:
            made.clear()
            made[gen] = ssl_client_context(ca_pem=tls.live.current.ca_cert)
        return made[gen]
    return context


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
    tls_admin: Any = None  # a secure node's doq.service.tls_admin.TlsAdmin


async def _listen(rt: Runtime, authz: Authorizer) -> _Listeners:
    """Start the gRPC server and the HTTP gateway; raises StartupError with neither running."""
    config, tls = rt.config, rt.tls
    forwarder = None
    if rt.node.cluster_admin() is not None:
        forwarder = LeaderForwarder(rt.node, max_message_bytes=grpc_frame_limit(rt.api.limits),
                                    credentials=ca_channel_credentials(tls.node.ca_cert) if tls else None)
        if tls is not None:  # a new trust bundle: verify the leader with it from the next call on
            fw = forwarder
            tls.live.subscribe(lambda m: fw.set_credentials(ca_channel_credentials(m.ca_cert)))
    # the client door: keys checked first; admin actions audited where they are served
    interceptors = [AuthInterceptor(authz, rt.api.limits.max_calls_per_key), *([forwarder] if forwarder else []), AuditInterceptor(authz, config.node_id)]
    try:
        grpc_server, grpc_port = build_server(
            rt.api, config.grpc_addr, interceptors=interceptors,
            credentials=tls.live.server_credentials() if tls else None)
    except (OSError, RuntimeError) as e:
        raise StartupError(f"cannot listen on gRPC address {config.grpc_addr}: {e}") from e
    await grpc_server.start()
    await set_serving(grpc_server, True)

    from doq.service.http_gateway import create_app

    host, port = _split(config.http_addr)
    forward_ssl = _forward_ssl(tls) if tls else None
    enrollment = tls_admin = None
    if tls is not None and rt.node.cluster_admin() is not None:
        from doq.service.enrollment import Enrollment
        from doq.service.tls_admin import TlsAdmin

        enrollment = Enrollment(rt.node, tls.live, rt.state.join_tokens)
        tls_admin = TlsAdmin(rt.node, tls.live, config_hosts(config))
    app = create_app(rt.api, authz, forward_ssl=forward_ssl, enrollment=enrollment,
                     loopback_http=is_loopback(host_of(config.http_addr)), history=rt.rate_history,
                     tls_admin=tls_admin)
    http = _QuietUvicornServer.make(app, host, port, config.log_level, rt.api.limits, tls)

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
    return _Listeners(grpc_server, grpc_port, forwarder, http, http_task, tls_admin)


async def serve(config: ServeConfig, *, ready: asyncio.Event | None = None,
                tls_secret: tuple[Path, float] | None = None) -> None:
    """Run a node until SIGTERM/SIGINT, then shut down gracefully. `tls_secret`: (the
    directory of a mounted TLS Secret, seconds between looks) for a secure node to take an
    updated Secret while it runs (`TlsAdmin.follow_secret`).

    Raises StartupError if the node cannot start (its directory held by another process,
    storage unusable, an address in use); a failed start leaves no directory behind that
    did not exist before it.
    """
    try:
        leader_label = k8s_leader.from_env()  # None unless DOQ_K8S_LEADER_LABEL is set
    except k8s_leader.K8sConfigError as e:
        raise StartupError(str(e)) from None
    try:
        provided_key = read_admin_key_file(config.admin_key_file)
    except ValueError as e:
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
    sampler = asyncio.create_task(run_sampler(rt.rate_history, rt.state.list_queues), name="doq-rate-history")
    # certificate expiry: the metric, and a warning ahead of it (doq.service.tls_admin)
    expiry = asyncio.create_task(listeners.tls_admin.watch(), name="doq-tls-expiry") if listeners.tls_admin else None
    secret_watch = asyncio.create_task(listeners.tls_admin.follow_secret(*tls_secret), name="doq-tls-secret") \
        if listeners.tls_admin and tls_secret else None
    admin_key = asyncio.create_task(ensure_admin_key(
        rt.node, config.data_dir, provided=provided_key,
        print_key=True if config.print_admin_key else None)) if authz.required else None
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
    if rt.tls:
        print(f"doq: TLS on every port (mutual TLS between members); clients verify the node with "
              f"--ca-file {rt.tls.node.ca_file}", flush=True)
    if ready:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    sampler.cancel()
    if expiry is not None:
        expiry.cancel()
    if secret_watch is not None:
        secret_watch.cancel()
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
