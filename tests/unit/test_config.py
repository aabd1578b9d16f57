from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from doq.config import ServeConfig, add_serve_arguments, load_config
from doq.errors import InvalidArgument


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return load_config(p.parse_args(argv), env or {})


def test_defaults_are_the_embedded_single_node() -> None:
    c = parse([])
    assert (c.data_dir, c.grpc_addr, c.http_addr, c.raft_addr) == (
        "data", "127.0.0.1:10000", "127.0.0.1:8000", "127.0.0.1:9000")
    assert c.join == ()


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "doq.toml"
    cfg.write_text('node-id = "from-file"\ndata_dir = "/file"\ngrpc_addr = "h:1"\njoin = ["a:1", "b:2"]\n')
    c = parse(["--config", str(cfg), "--node-id", "from-flag"], {"DOQ_DATA_DIR": "/env"})
    assert c.node_id == "from-flag" and c.data_dir == "/env" and c.grpc_addr == "h:1"
    assert c.join == ("a:1", "b:2")
    assert parse(["--join", "x:1, y:2"]).join == ("x:1", "y:2")


@pytest.mark.parametrize("argv", [
    ["--grpc-addr", "nohostport"], ["--http-addr", "h:99999"], ["--node-id", "a/b"],
    ["--max-message-bytes", "big"], ["--log-level", "loud"], ["--join", "x"],
    ["--advertise-host", "h:1"], ["--advertise-host", "a/b"], ["--election-timeout-ms", "499"],
    ["--election-timeout-ms", "1s"],
])
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        parse(argv)


def test_unknown_config_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "doq.toml"
    cfg.write_text('grpc_adr = "h:1"\n')
    with pytest.raises(InvalidArgument, match="unknown key"):
        parse(["--config", str(cfg)])


def test_the_seeds_dotted_flags_name_the_same_settings() -> None:
    c = parse(["--storage.data_dir", "d", "--cluster.node_id", "node-2", "--http.port", "8002",
               "--raft.address", "localhost:9002", "--grpc.address", "localhost:10002",
               "--cluster.join_addr", "localhost:8001"])
    assert (c.data_dir, c.node_id, c.http_addr, c.raft_addr, c.grpc_addr, c.join) == (
        "d", "node-2", "127.0.0.1:8002", "localhost:9002", "localhost:10002", ("localhost:8001",))
    assert parse(["--http.port", "8001"], {"DOQ_HTTP_ADDR": "0.0.0.0:1"}).http_addr == "127.0.0.1:8001"


@pytest.mark.parametrize("argv", [
    ["--http.port", "x"], ["--http.port", "70000"], ["--http.port", "1", "--http-addr", "h:2"],
    ["--raft.address", "nohostport"],
])
def test_bad_seed_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        parse(argv)


def test_advertise_host_replaces_the_host_of_each_announced_address() -> None:
    """A node listening on 0.0.0.0 (a pod) announces the name its peers reach it at."""
    c = parse([], {"DOQ_GRPC_ADDR": "0.0.0.0:10000", "DOQ_HTTP_ADDR": "0.0.0.0:8000",
                   "DOQ_RAFT_ADDR": "0.0.0.0:9000", "DOQ_ADVERTISE_HOST": "doq-1.doq-internal.ns.svc"})
    a = c.member_addrs()
    assert (a.raft_addr, a.grpc_addr, a.http_addr) == (
        "doq-1.doq-internal.ns.svc:9000", "doq-1.doq-internal.ns.svc:10000", "doq-1.doq-internal.ns.svc:8000")
    assert (c.grpc_addr, c.http_addr, c.raft_addr) == ("0.0.0.0:10000", "0.0.0.0:8000", "0.0.0.0:9000")
    plain = parse(["--http-addr", "localhost:8001"]).member_addrs()
    assert (plain.http_addr, plain.raft_addr) == ("localhost:8001", "127.0.0.1:9000")
    assert parse(["--advertise-host", "[::1]"]).member_addrs().grpc_addr == "[::1]:10000"


def test_election_timeout_from_env() -> None:
    assert parse([]).election_timeout_ms == 1000
    assert parse([], {"DOQ_ELECTION_TIMEOUT_MS": "2500"}).election_timeout_ms == 2500


def test_snapshot_settings_reach_the_raft_driver_with_its_defaults() -> None:
    from doq.node.raft_node import RaftNodeConfig

    c, driver = parse([]), RaftNodeConfig()
    assert (c.snapshot_every, c.keep_entries, c.restore_chunk_bytes) == (
        driver.snapshot_every, driver.keep_entries, driver.restore_chunk_bytes)
    # the field's default (tests/conftest.py may force the driver's for a whole run)
    assert c.apply_thread == {f.name: f.default for f in dataclasses.fields(RaftNodeConfig)}["apply_thread"]
    assert parse([], {"DOQ_APPLY_THREAD": "1"}).apply_thread is True
    assert parse([], {"DOQ_APPLY_THREAD": "0"}).apply_thread is False
    assert c.hold_commit_ms == {f.name: f.default for f in dataclasses.fields(RaftNodeConfig)}["hold_commit_ms"]
    assert parse(["--hold-commit-ms", "0"], {}).hold_commit_ms == 0
    c = parse(["--snapshot-every", "50", "--restore-chunk-bytes", "4096"], {"DOQ_KEEP_ENTRIES": "0"})
    assert (c.snapshot_every, c.keep_entries, c.restore_chunk_bytes) == (50, 0, 4096)


def test_stream_bounds_reach_the_node_limits_with_their_defaults() -> None:
    from doq.server import node_limits
    from doq.service.limits import Limits

    assert node_limits(parse([])) == Limits()
    limits = node_limits(parse(["--max-stream-prefetch", "50"], {"DOQ_MAX_STREAM_PENDING_ACKS": "7"}))
    assert (limits.max_stream_prefetch, limits.max_stream_pending_acks) == (50, 7)
    for argv in (["--max-stream-prefetch", "0"], ["--max-stream-pending-acks", "many"]):
        with pytest.raises(InvalidArgument):
            parse(argv)


@pytest.mark.parametrize("argv", [["--snapshot-every", "-1"], ["--keep-entries", "many"],
                                  ["--restore-chunk-bytes", "10"]])
def test_bad_snapshot_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgument, match=argv[0]):
        parse(argv)


def test_secure_and_insecure_are_switches_also_set_by_the_environment() -> None:
    import argparse

    from doq.config import add_serve_arguments, load_config

    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    assert load_config(p.parse_args([]), {}).secure is False
    assert load_config(p.parse_args(["--secure"]), {}).secure is True
    assert load_config(p.parse_args([]), {"DOQ_INSECURE": "1"}).insecure is True
    assert load_config(p.parse_args([]), {"DOQ_SECURE": "0"}).secure is False


def test_the_join_token_never_shows_in_the_configs_repr() -> None:
    from doq.config import ServeConfig

    assert "s3cret" not in repr(ServeConfig(join_token="doqjt1.s3cret"))
