"""`doq serve` configuration: flags > DOQ_* environment > TOML config file > defaults."""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from doq.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class ServeConfig:
    node_id: str = "node-1"
    data_dir: str = "data"
    grpc_addr: str = "127.0.0.1:10000"
    http_addr: str = "127.0.0.1:8000"
    raft_addr: str = "127.0.0.1:9000"
    join: tuple[str, ...] = field(default_factory=tuple)
    max_message_bytes: int = 1024 * 1024
    log_level: str = "info"
    snapshot_every: int = 10_000  # as RaftNodeConfig (a unit test keeps them equal)
    keep_entries: int = 5_000


_HELP = {
    "node_id": "this node's id; its files live under DATA_DIR/NODE_ID",
    "data_dir": "directory for data (several nodes may share one)",
    "grpc_addr": "gRPC listen address HOST:PORT",
    "http_addr": "HTTP gateway listen address HOST:PORT",
    "raft_addr": "Raft peer listen address HOST:PORT",
    "join": "HTTP address(es) of a node of an existing cluster (comma separated)",
    "max_message_bytes": "largest message content accepted",
    "log_level": "debug | info | warning | error",
    "snapshot_every": "applied log entries between two snapshots of the state (0: never)",
    "keep_entries": "log entries kept behind a snapshot for followers that lag",
}

#: integer settings: (lowest, highest or None) accepted
_INT_RANGES: dict[str, tuple[int, int | None]] = {
    "max_message_bytes": (1, 64 * 1024 * 1024),
    "snapshot_every": (0, None),
    "keep_entries": (0, None),
}


class FlagDefault(str):
    """A flag's default as argparse holds it (so `--help` can show it) while marking the value
    as "not given on the command line": an environment variable or the config file may still
    set it (flags > DOQ_* environment > config file > defaults)."""


def _shown_default(value: Any) -> FlagDefault:
    if isinstance(value, tuple):
        value = ",".join(value) or "none"
    return FlagDefault(value)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=FlagDefault("none"),
                   help="TOML config file, keys as the flags with _ or - (env DOQ_CONFIG)")
    for f in fields(ServeConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default_factory is MISSING else f.default_factory()  # type: ignore[misc]
        p.add_argument(flag, dest=f.name, default=_shown_default(default),
                       help=f"{_HELP[f.name]} (env DOQ_{f.name.upper()})")


def given(value: Any) -> bool:
    """Was this flag given on the command line (rather than left at its shown default)?"""
    return value is not None and not isinstance(value, FlagDefault)


def _parse_addr(name: str, value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"--{name.replace('_', '-')} must be HOST:PORT, got {value!r}")
    return value


def _coerce(name: str, value: Any) -> Any:
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
    value = str(value)
    if name.endswith("_addr"):
        return _parse_addr(name, value)
    if name == "log_level" and value.lower() not in ("debug", "info", "warning", "error"):
        raise InvalidArgument(f"--log-level must be debug, info, warning or error, got {value!r}")
    if name == "node_id" and (not value or "/" in value or value in (".", "..")):
        raise InvalidArgument(f"--node-id must be a plain name, got {value!r}")
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
    return ServeConfig(**{k: _coerce(k, val) for k, val in values.items()})
