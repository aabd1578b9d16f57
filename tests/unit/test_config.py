from __future__ import annotations

import argparse
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
])
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        parse(argv)


def test_unknown_config_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "doq.toml"
    cfg.write_text('grpc_adr = "h:1"\n')
    with pytest.raises(InvalidArgument, match="unknown key"):
        parse(["--config", str(cfg)])


def test_snapshot_settings_reach_the_raft_driver_with_its_defaults() -> None:
    from doq.node.raft_node import RaftNodeConfig

    c, driver = parse([]), RaftNodeConfig()
    assert (c.snapshot_every, c.keep_entries) == (driver.snapshot_every, driver.keep_entries)
    c = parse(["--snapshot-every", "50"], {"DOQ_KEEP_ENTRIES": "0"})
    assert (c.snapshot_every, c.keep_entries) == (50, 0)


@pytest.mark.parametrize("argv", [["--snapshot-every", "-1"], ["--keep-entries", "many"]])
def test_bad_snapshot_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgument, match=argv[0]):
        parse(argv)
