"""`doq serve` configuration: flags > DOQ_* environment > TOML config file > defaults."""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from doq.errors import InvalidArgument
from doq.flags import FlagDefault, given, shown_default
from doq.node.cluster import MemberAddrs
from doq.storage.env import DEFAULT_MAP_SIZE, MIN_MAP_SIZE
from doq.units import format_size, parse_size


@dataclass(frozen=True, slots=True)
class ServeConfig:
    node_id: str = "node-1"
    data_dir: str = "data"
    grpc_addr: str = "127.0.0.1:10000"
    http_addr: str = "127.0.0.1:8000"
    raft_addr: str = "127.0.0.1:9000"
    join: tuple[str, ...] = field(default_factory=tuple)
    cluster_id: str = ""
    advertise_host: str = ""
    election_timeout_ms: int = 1000
    max_message_bytes: int = 1024 * 1024
    log_level: str = "info"
    snapshot_every: int = 10_000  # as RaftNodeConfig (a unit test keeps them equal)
    keep_entries: int = 5_000
    restore_chunk_bytes: int = 1 << 20  # as RaftNodeConfig
    max_stream_prefetch: int = 100_000  # as doq.service.limits (a unit test keeps them equal)
    max_stream_pending_acks: int = 10_000
    secure: bool = False  # TLS whatever the addresses (doq/tls/mode.py)
    insecure: bool = False  # no TLS even on non-loopback addresses
    print_admin_key: bool = False  # print the first admin key even when stdout is no terminal (doq/auth/bootstrap.py)
    tls_cert: str = ""  # client ports' certificate file (none: the node's, from the cluster CA)
    tls_key: str = ""
    join_token: str = field(default="", repr=False)  # a secret: enrolls in a secure cluster (doq/tls/enrollment.py)
    admin_key_file: str = ""  # the first admin key, provided (doq/auth/bootstrap.py)
    max_data_size: int = DEFAULT_MAP_SIZE  # the LMDB map: the most the store may hold
    disk_free_limit: int = 64 << 20  # free disk under which writes that grow the state stop
    max_connections: int = 1000  # as doq.service.limits.Limits (the HTTP connection limits)
    max_calls: int = 4096  # as doq.service.limits.Limits (gRPC calls in progress)
    max_calls_per_key: int = 1024  # as doq.service.limits.Limits (gRPC calls in progress of one key)
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    read_timeout_ms: int = 30_000
    keep_alive_ms: int = 5_000
    max_restore_size: int = 4 << 30
    max_queues: int = 10_000  # as doq.service.limits.Limits
    apply_thread: bool = False  # as RaftNodeConfig (a unit test keeps them equal)
    hold_commit_ms: int = 100  # as RaftNodeConfig (a unit test keeps them equal)
    parallel_load_min: int = 500_000  # as doq.storage.state.PARALLEL_LOAD_MIN

    def member_addrs(self) -> MemberAddrs:
        """The addresses this node announces to the cluster (and clients are sent to): the
        listen addresses, each with its host replaced by `advertise_host` when that is set
        (a node listening on 0.0.0.0 must announce a name the others can reach)."""
        def announced(addr: str) -> str:
            if not self.advertise_host:
                return addr
            return f"{self.advertise_host}:{addr.rpartition(':')[2]}"

        return MemberAddrs(announced(self.raft_addr), announced(self.grpc_addr), announced(self.http_addr))


_HELP = {
    "node_id": "this node's id; its files live under DATA_DIR/NODE_ID",
    "data_dir": "directory for data (several nodes may share one)",
    "grpc_addr": "gRPC listen address HOST:PORT",
    "http_addr": "HTTP gateway listen address HOST:PORT",
    "raft_addr": "Raft peer listen address HOST:PORT",
    "join": "HTTP address(es) of a node of an existing cluster (comma separated)",
    "cluster_id": "the cluster this node belongs to: a joining node joins no other, and a node "
                  "whose store holds another refuses to start (none: any when joining)",
    "advertise_host": "host the other members and clients reach this node at, announced with "
                      "the ports of the listen addresses (none: the listen addresses themselves)",
    "election_timeout_ms": "Raft election timeout: a follower that hears from no leader for 1-2x "
                           "this long starts an election (500..60000, in steps of the 100 ms tick)",
    "max_message_bytes": "largest message content accepted",
    "log_level": "debug | info | warning | error",
    "snapshot_every": "applied log entries between two snapshots of the state (0: never)",
    "keep_entries": "log entries kept behind a snapshot for followers that lag",
    "secure": "TLS on every port (mutual TLS between members, a cluster CA made on the first "
              "start) whatever the addresses; the default as soon as an address is not loopback",
    "insecure": "no TLS even on non-loopback addresses (anyone who reaches a port can do anything)",
    "print_admin_key": "print the first admin key on stdout even when stdout is not a terminal "
                       "(by default it is printed only to a terminal; it is always in DATA_DIR/admin.key)",
    "tls_cert": "certificate (PEM) for the client ports, gRPC and HTTP (none: the node's own, "
                "signed by the cluster CA)",
    "tls_key": "private key (PEM) of --tls-cert",
    "join_token": "with --join: a token from `doq join-token create` that enrolls this node in a "
                  "secure cluster (it gets the cluster CA); prefer the environment variable",
    "admin_key_file": "a file holding an admin key (`doq_...`, e.g. a mounted Kubernetes Secret): "
                      "a secure node that leads a cluster without any key registers it as the first "
                      "admin key, instead of generating DATA_DIR/admin.key",
    "max_data_size": "the most this node's store (state and Raft log) may hold, e.g. 16MiB or "
                     "64GiB; near it, writes that grow the state are refused (retryable) until "
                     "space is freed",
    "disk_free_limit": "free disk space under which this node refuses writes that grow the "
                       "state, e.g. 64MiB (0: only a full disk stops them)",
    "max_connections": "HTTP connections served at once (past it requests are answered 503); also the most "
                       "gRPC connections held (past it new ones are closed)",
    "max_calls": "gRPC calls in progress at once on the client port (streams included, long polls "
                 "too); past it a new call is refused RESOURCE_EXHAUSTED",
    "max_calls_per_key": "gRPC calls of one client key in progress at once on the client port (streams and "
                         "long polls included); past it a new call of that key is refused RESOURCE_EXHAUSTED "
                         "KEY_CALLS_LIMIT, so one key cannot take every call --max-calls allows",
    "max_header_bytes": "largest HTTP request line and headers together; past it 431",
    "max_headers": "most HTTP request header fields; past it 431",
    "read_timeout_ms": "an HTTP request whose headers are not all in this long after its first "
                       "byte, or whose body pauses this long, is closed (408), as is a connection "
                       "that sends no request",
    "keep_alive_ms": "an idle HTTP keep-alive connection is closed after this (a gRPC connection without a "
                     "call: after this or --read-timeout-ms, whichever is longer)",
    "max_restore_size": "largest POST /db/restore upload (spooled to disk; past it 413), e.g. 4GiB",
    "max_queues": "most queues the cluster holds: creating one more is refused (429 / "
                  "RESOURCE_EXHAUSTED QUEUE_LIMIT_REACHED) until one is deleted; the leader's "
                  "applies (0: no limit)",
    "apply_thread": "apply committed entries to the state (its LMDB commit) on a thread of their own, "
                    "off the Raft log's path: the node appends the next entries meanwhile (1: on, 0: off)",
    "hold_commit_ms": "longest a write transaction of the state (applied entries, durable in the Raft "
                      "log) stays open across writes before its LMDB commit (0: every write commits)",
    "parallel_load_min": "a start with at least this many message records stored loads them on two "
                         "CPUs (a second process reads half) when the node may use more than one "
                         "(0: always one)",
    "restore_chunk_bytes": "record bytes (uncompressed) per log entry of an online restore "
                           "(1024..16777216)",
    "max_stream_prefetch": "largest prefetch (and free credits) of one dequeue stream; more is "
                           "refused with INVALID_ARGUMENT (1..10000000)",
    "max_stream_pending_acks": "acks, nacks and releases of one dequeue stream proposed and not yet "
                               "committed; at this many the node stops reading the stream (1..1000000)",
}

#: integer settings: (lowest, highest or None) accepted
_INT_RANGES: dict[str, tuple[int, int | None]] = {
    "max_message_bytes": (1, 64 * 1024 * 1024),
    "snapshot_every": (0, None),
    "keep_entries": (0, None),
    "restore_chunk_bytes": (1024, 16 * 1024 * 1024),
    "max_stream_prefetch": (1, 10_000_000),
    "max_stream_pending_acks": (1, 1_000_000),
    "max_connections": (1, 1_000_000),
    "max_calls": (1, 1_000_000),
    "max_calls_per_key": (1, 1_000_000),
    "max_header_bytes": (1024, 16 * 1024 * 1024),
    "max_headers": (8, 100_000),
    "read_timeout_ms": (100, 3_600_000),
    "keep_alive_ms": (100, 3_600_000),
    "max_queues": (0, 100_000_000),
    "hold_commit_ms": (0, 60_000),
    "parallel_load_min": (0, None),
}

#: byte-size settings (`doq.units.parse_size`): (lowest, highest) accepted
_SIZE_RANGES: dict[str, tuple[int, int]] = {
    "max_data_size": (MIN_MAP_SIZE, 1 << 50),
    "disk_free_limit": (0, 1 << 50),
    "max_restore_size": (1 << 20, 1 << 50),
}


SEED_FLAGS = {
    "node_id": "--cluster.node_id",
    "data_dir": "--storage.data_dir",
    "grpc_addr": "--grpc.address",
    "raft_addr": "--raft.address",
    "join": "--cluster.join_addr",
}
"""The seed's dotted flags: other names of the same settings (`--http.port` is apart)."""
SEED_HTTP_HOST = "127.0.0.1"
"""`--http.port PORT` means `--http-addr 127.0.0.1:PORT`."""


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=FlagDefault("none"),
                   help="TOML config file, keys as the flags with _ or - (env DOQ_CONFIG)")
    for f in fields(ServeConfig):
        flags = ["--" + f.name.replace("_", "-")]
        if f.name in SEED_FLAGS:
            flags.append(SEED_FLAGS[f.name])
        default = f.default if f.default_factory is MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, bool):
            p.add_argument(*flags, dest=f.name, action="store_const", const=True, default=None,
                           help=f"{_HELP[f.name]} (env DOQ_{f.name.upper()}=1)")
            continue
        p.add_argument(*flags, dest=f.name, default=shown_default(default),
                       help=f"{_HELP[f.name]} (env DOQ_{f.name.upper()})")
    p.add_argument("--http.port", dest="http_port", metavar="PORT",
                   help=f"the seed's flag: the HTTP gateway on {SEED_HTTP_HOST}:PORT (instead of --http-addr)")


_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")  # a DNS name, IPv4, or [IPv6]


def _parse_addr(name: str, value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"--{name.replace('_', '-')} must be HOST:PORT, got {value!r}")
    return value


_BOOLS = {"secure", "insecure", "print_admin_key", "apply_thread"}


def _coerce(name: str, value: Any) -> Any:
    if name in _BOOLS:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise InvalidArgument(f"--{name} takes no value; DOQ_{name.upper()} must be 1 or 0, got {value!r}")
    if name == "join":
        if isinstance(value, (list, tuple)):
            items = [str(x) for x in value]
        else:
            items = [x.strip() for x in str(value).split(",") if x.strip()]
        return tuple(_parse_addr(name, x) for x in items)
    if name in _INT_RANGES:
        flag = "--" + name.replace("_", "-")
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{flag} must be an integer, got {value!r}") from None
        lo, hi = _INT_RANGES[name]
        if hi is None and n < lo:
            raise InvalidArgument(f"{flag} must be at least {lo}, got {n}")
        if hi is not None and not lo <= n <= hi:
            raise InvalidArgument(f"{flag} must be within {lo}..{hi}")
        return n
    if name in _SIZE_RANGES:
        flag = "--" + name.replace("_", "-")
        n = parse_size(value, what=flag)
        lo, hi = _SIZE_RANGES[name]
        if not lo <= n <= hi:
            raise InvalidArgument(f"{flag} must be within {format_size(lo)}..{format_size(hi)}, got {value!r}")
        return n
    if name == "election_timeout_ms":
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise InvalidArgument(f"--election-timeout-ms must be an integer, got {value!r}") from None
        if not 500 <= n <= 60_000:
            raise InvalidArgument("--election-timeout-ms must be within 500..60000")
        return n
    value = str(value)
    if name.endswith("_addr"):
        return _parse_addr(name, value)
    if name == "log_level" and value.lower() not in ("debug", "info", "warning", "error"):
        raise InvalidArgument(f"--log-level must be debug, info, warning or error, got {value!r}")
    if name == "advertise_host" and value and not _HOST.fullmatch(value):
        raise InvalidArgument(f"--advertise-host must be a host name or IP address without a port, got {value!r}")
    if name == "node_id":
        from doq.node.member_input import check_node_id

        try:
            check_node_id(value)
        except InvalidArgument as e:
            raise InvalidArgument(f"--node-id: {e.message}") from None
    return value


def load_config(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> ServeConfig:
    """Merge flags, DOQ_* env and the config file; raises InvalidArgument on bad values."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    flag_config = getattr(ns, "config", None)
    config_path = flag_config if given(flag_config) else env.get("DOQ_CONFIG")
    if config_path:
        try:
            raw = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument(f"cannot read config file {config_path}: {e}") from None
        known = {f.name for f in fields(ServeConfig)}
        for key, val in raw.items():
            k = key.replace("-", "_")
            if k not in known:
                raise InvalidArgument(f"unknown key {key!r} in config file {config_path}")
            values[k] = val
    for f in fields(ServeConfig):
        if (env_value := env.get(f"DOQ_{f.name.upper()}")) is not None:
            values[f.name] = env_value
        if given(flag := getattr(ns, f.name, None)):
            values[f.name] = flag
    if (port := getattr(ns, "http_port", None)) is not None:
        if given(getattr(ns, "http_addr", None)):
            raise InvalidArgument("give --http-addr or --http.port, not both")
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise InvalidArgument(f"--http.port must be a port number, got {port!r}")
        values["http_addr"] = f"{SEED_HTTP_HOST}:{int(port)}"
    config = ServeConfig(**{k: _coerce(k, val) for k, val in values.items()})
    if config.join:  # the addresses it announces go into the cluster's configuration: checked now
        from doq.node.member_input import check_member_addrs

        try:
            check_member_addrs(config.member_addrs())
        except InvalidArgument as e:
            raise InvalidArgument(f"this node cannot join with the addresses it would announce "
                                  f"(listen addresses, --advertise-host): {e.message}") from None
    return config
