"""doq next to RabbitMQ's quorum queue, through the same workloads as users write them.

`python bench/side_by_side.py` starts a fresh
`doq serve` (durable: fsync before every confirmation) and, when `rabbitmq-server` is
installed (Debian: `apt-get install rabbitmq-server`; the Python client is pika:
`pip install pika`), a fresh RabbitMQ node with a quorum queue (durable by design,
persistent messages), both in temp dirs on 127.0.0.1, and runs in one go:

- `producer`: one enqueue and one confirmation per message. doq:
  `p = c.producer(window=1000); fs = [p.enqueue(q, body) for ...]; f.result()` for each;
  RabbitMQ: pika with publisher confirms, at most 1000 unconfirmed.
- `consumer`: pre-filled queue, one ack per message. doq:
  `for m in c.consumer(q, prefetch=1000): cons.ack(m)`; RabbitMQ: prefetch 1000,
  `basic_ack` each. The run ends when the server has every ack (doq: the queue is
  empty; RabbitMQ: a synchronous call after the last ack on the same channel).
- `e2e`: a producer paced at `--rate` msg/s (confirms as above) and a consumer in another
  process acking each; latency = publish call -> delivery to the consumer (monotonic
  clock, shared by the processes of this machine). Both producers start on an open
  connection (RabbitMQ: connection, channel and queue declared; doq: a `get_queue`
  answered).
- `calls`: one call at a time, each waiting for its confirmation (a web handler enqueuing
  a job): doq `c.enqueue(q, body)` in a loop; RabbitMQ: pika's `BlockingConnection` with
  `confirm_delivery()`, `basic_publish` in a loop (each returns once confirmed). Latency
  per call (p50 / p99) and calls per second; `--calls-count` calls per run.

Every client runs in its own child process (one per run), the systems alternate run by
run, and each figure is the median of `--runs`. 100-byte messages unless
`--payload-bytes`. Prints a table with the ratios doq / RabbitMQ, the load average
before and after, and (`--json FILE`) writes every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

from doq.ports import free_port

RABBIT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
INSTALL_HINT = (
    "RabbitMQ is not installed: `apt-get update && apt-get install -y rabbitmq-server` "
    "(Debian package) and `pip install pika`; measuring doq alone"
)
WINDOW = 1000
PREFETCH = 1000
_TS = struct.Struct("<q")


def child_env() -> dict[str, str]:
    """The environment of child processes: they import this checkout's doq and doq_client."""
    root = Path(__file__).resolve().parents[1]
    paths = [str(root), str(root / "clients" / "python"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float,
          log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: see {log}")
        if ready():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s}s: see {log}")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- servers ------------------------------------------------------------------------------
@dataclass
class Server:
    """A started server: the address its clients use and the pid whose CPU time is read."""

    addr: str
    pids: tuple[int, ...]
    ca_file: str | None = None  # a secure doq's cluster CA
    http_url: str = ""  # doq: the first node's HTTP gateway (answered /readyz 200 before the yield)

    def cpu_s(self) -> float:
        """CPU time (user + system) its processes (every node of a cluster) have used so far."""
        return sum(_cpu_s(pid) for pid in self.pids)


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) of process `pid` so far (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _http_json(url: str, context: ssl.SSLContext | None = None, key: str = "") -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=2, context=context) as r:
        return json.loads(r.read())


def _ssl(secure: bool, ca_file: str) -> ssl.SSLContext | None:
    """The client context for a secure node (None: plain HTTP); its CA exists once it started."""
    if not secure or not os.path.exists(ca_file):
        return None
    return ssl.create_default_context(cafile=ca_file)


DOQ_CA: dict[str, str] = {}
"""gRPC address -> CA file of the secure doq servers (`doq-tls`); plain ones are absent."""
DOQ_KEY: dict[str, str] = {}
"""gRPC address -> the admin key of the secure doq servers (they require a key)."""


def _doq(addr: str) -> Any:
    from doq_client import DoqClient

    return DoqClient(addr, ca_file=DOQ_CA.get(addr), key=DOQ_KEY.get(addr))


def _env_for(cmd: list[str]) -> dict[str, str]:
    """`child_env()` for a child command, with `$DOQ_KEY` when its `--addr` is a secure doq."""
    env = child_env()
    addr = cmd[cmd.index("--addr") + 1] if "--addr" in cmd else ""
    if addr in DOQ_KEY:
        env["DOQ_KEY"] = DOQ_KEY[addr]
    return env


@contextlib.contextmanager
def doq_server(root: Path, nodes: int = 1, launcher: Sequence[str] = (), secure: bool = False,
               extra_args: Sequence[str] = (), ready_timeout_s: float = 60.0) -> Iterator[Server]:
    """A fresh `doq serve` (a one-node Raft cluster, as users run it), or `nodes` of them
    forming one cluster by `--join` (the address is the leader's: node-1, which bootstraps).
    `launcher` replaces `python -m doq` (e.g. to start it with probes: `bench/e2e_stages.py`).
    `secure`: `--secure` (TLS on every port; the clients verify with the cluster CA).
    `ready_timeout_s`: how long each node may take to answer `/readyz` (a restart on a
    large backlog rebuilds its state first)."""
    root.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    grpc_addrs: list[str] = []
    http_urls: list[str] = []
    ca_file = str(root / "data" / "node-1" / "tls" / "ca.crt")
    try:
        for i in range(1, nodes + 1):
            grpc_port, http_port, raft_port = free_port(), free_port(), free_port()
            log = root / f"doq-{i}.log"
            cmd = [*(launcher or (sys.executable, "-m", "doq")), "serve", "--node-id", f"node-{i}",
                   "--data-dir", str(root / "data"),
                   "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
                   "--raft-addr", f"127.0.0.1:{raft_port}", "--log-level", "warning", *extra_args]
            if secure:
                cmd.append("--secure")
                if i > 1:  # a member of a secure cluster needs its CA (docs/security.md)
                    (root / "data" / f"node-{i}" / "tls").mkdir(parents=True, exist_ok=True)
                    for name in ("ca.crt", "ca.key"):
                        shutil.copy(Path(ca_file).with_name(name), root / "data" / f"node-{i}" / "tls" / name)
            if http_urls:
                cmd += ["--join", http_urls[0].split("://")[1]]
            env = child_env()
            if secure and i > 1:  # `POST /cluster/join` is an admin action on a secure cluster
                env["DOQ_KEY"] = (root / "data" / "admin.key").read_text().strip()
            with open(log, "ab") as logf:
                procs.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env))
            grpc_addrs.append(f"127.0.0.1:{grpc_port}")
            http_urls.append(f"{'https' if secure else 'http'}://127.0.0.1:{http_port}")
            url = http_urls[-1]

            def ready(url: str = url) -> bool:
                try:
                    with urllib.request.urlopen(f"{url}/readyz", timeout=1, context=_ssl(secure, ca_file)) as r:
                        return bool(r.status == 200)
                except OSError:
                    return False

            _wait(f"doq serve node-{i}", ready, procs[-1], ready_timeout_s, log)

        def formed() -> bool:
            key_file = root / "data" / "admin.key"  # a secure node's (`extra_args` --secure)
            try:
                view = _http_json(f"{http_urls[0]}/cluster", _ssl(secure, ca_file),
                                  key_file.read_text().strip() if key_file.exists() else "")
            except OSError:
                return False
            voters = [m for m in view["members"] if m["role"] == "voter"]
            return len(voters) == nodes and view.get("leader_id") == "node-1"

        _wait(f"a {nodes}-node doq cluster", formed, procs[0], 120, root / "doq-1.log")
        if secure:
            DOQ_CA[grpc_addrs[0]] = ca_file
            DOQ_KEY[grpc_addrs[0]] = (root / "data" / "admin.key").read_text().strip()
        yield Server(grpc_addrs[0], tuple(p.pid for p in procs), ca_file if secure else None, http_urls[0])
    finally:
        for proc in procs:
            _stop(proc)


def rabbit_installed() -> bool:
    try:
        import pika  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(RABBIT_SERVER)


RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


@contextlib.contextmanager
def rabbit_server(root: Path, nodes: int = 1) -> Iterator[Server]:
    """A fresh RabbitMQ on 127.0.0.1 (its own epmd port): one node, or `nodes` joined into
    one cluster by `rabbitmqctl join_cluster` (quorum queues then have `nodes` replicas).
    The address is node 1's AMQP port (where the bench declares, so leads, its queues)."""
    root.mkdir(parents=True, exist_ok=True)
    epmd = free_port()
    cookie = root / ".erlang.cookie"
    cookie.write_text(f"DOQBENCH{epmd}")
    cookie.chmod(0o400)
    base_env = {**os.environ, "HOME": str(root), "ERL_EPMD_ADDRESS": "127.0.0.1",
                "ERL_EPMD_PORT": str(epmd)}
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    names: list[str] = []
    amqp_ports: list[int] = []

    def ctl(node: str, *args: str) -> None:
        subprocess.run([RABBITMQCTL, "-n", node, *args], env=base_env, check=True,
                       capture_output=True, timeout=120)

    try:
        for i in range(1, nodes + 1):
            amqp, dist = free_port(), free_port()
            d = root / f"n{i}"
            d.mkdir()
            (d / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{amqp}\nloopback_users = none\n")
            (d / "enabled_plugins").write_text("[].\n")
            name = f"doqbench{amqp}@localhost"
            env = {
                **base_env,
                "RABBITMQ_NODENAME": name,
                "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
                "RABBITMQ_LOG_BASE": str(d / "log"),
                "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(d / "pid"),
                "RABBITMQ_DIST_PORT": str(dist),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            }
            log = d / "rabbitmq.out"
            with open(log, "ab") as logf:
                proc = subprocess.Popen([RABBIT_SERVER], stdout=logf, stderr=subprocess.STDOUT, env=env,
                                        cwd=d, start_new_session=True)
            procs.append((proc, d))
            names.append(name)
            amqp_ports.append(amqp)

            def ready(amqp: int = amqp) -> bool:
                import pika

                try:
                    pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp)).close()
                    return True
                except Exception:
                    return False

            _wait(f"rabbitmq-server {name}", ready, proc, 120, log)
            if i > 1:
                ctl(name, "stop_app")
                ctl(name, "join_cluster", names[0])
                ctl(name, "start_app")
                _wait(f"rabbitmq-server {name} in the cluster", ready, proc, 120, log)
        pids = tuple(int((d / "pid").read_text().split()[0]) if (d / "pid").exists() else p.pid
                     for p, d in procs)
        yield Server(str(amqp_ports[0]), pids)
    finally:
        for proc, _ in reversed(procs):
            _stop(proc, 60)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["epmd", "-port", str(epmd), "-kill"], env=base_env, timeout=10,
                           capture_output=True, check=False)


# -- doq clients (as users write them) -----------------------------------------------------
def _doq_queue(target: str, queue: str) -> None:
    from doq_client import AlreadyExists, PermissionDenied

    # a key that may not create queues (`bench/keys_cost.py`) uses the queue created for it
    with _doq(target) as c, contextlib.suppress(AlreadyExists, PermissionDenied):
        c.create_queue(queue)


def doq_produce(target: str, queue: str, count: int, payload: int) -> dict[str, Any]:
    _doq_queue(target, queue)
    body = b"x" * payload
    with _doq(target) as c:
        p = c.producer(window=WINDOW)
        t0 = time.perf_counter()
        futures = [p.enqueue(queue, body) for _ in range(count)]
        ids = [f.result().id for f in futures]
        seconds = time.perf_counter() - t0
        p.close()
    assert len(set(ids)) == count
    return {"messages": count, "seconds": seconds}


def doq_prefill(target: str, queue: str, count: int, payload: int) -> None:
    from doq_client import enqueue_request

    _doq_queue(target, queue)
    body = b"x" * payload
    with _doq(target) as c:
        p = c.producer(window=20_000, batch=1000)
        fs = [p.enqueue_many([enqueue_request(queue, body)] * 1000) for _ in range(count // 1000)]
        if count % 1000:
            fs.append(p.enqueue_many([enqueue_request(queue, body)] * (count % 1000)))
        for f in fs:
            f.result()
        p.close()


def doq_consume(target: str, queue: str, count: int) -> dict[str, Any]:
    with _doq(target) as c:
        n = 0
        t0 = time.perf_counter()
        cons = c.consumer(queue, prefetch=PREFETCH)
        for m in cons:
            cons.ack(m)
            n += 1
            if n == count:
                break
        deadline = time.monotonic() + 60
        while c.get_queue(queue).stats.total and time.monotonic() < deadline:
            time.sleep(0.001)
        seconds = time.perf_counter() - t0
        cons.close()
    return {"messages": n, "seconds": seconds}


def doq_e2e_consumer(target: str, queue: str, count: int, ready: Callable[[], None]) -> list[float]:
    _doq_queue(target, queue)
    lat: list[float] = []
    with _doq(target) as c:
        cons = c.consumer(queue, prefetch=PREFETCH)
        with cons:
            ready()
            for m in cons:
                lat.append((time.monotonic_ns() - _TS.unpack_from(m.content)[0]) / 1e6)
                cons.ack(m)
                if len(lat) == count:
                    break
    return lat


def doq_e2e_producer(target: str, queue: str, count: int, payload: int, rate: float) -> None:
    pad = b"x" * max(0, payload - 8)
    with _doq(target) as c:
        c.get_queue(queue)  # connected before the clock starts, as pika is (connection, channel, declare)
        p = c.producer(window=WINDOW)
        futures = []
        t0 = time.monotonic()
        for i in range(count):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(p.enqueue(queue, _TS.pack(time.monotonic_ns()) + pad))
        for f in futures:
            f.result()
        p.close()


def doq_calls(target: str, queue: str, count: int, payload: int) -> list[float]:
    """`count` enqueues one at a time, each waiting for its confirmation; ms per call."""
    _doq_queue(target, queue)
    body = b"x" * payload
    lat: list[float] = []
    with _doq(target) as c:
        c.get_queue(queue)  # connected before the first timed call, as pika is
        for _ in range(count):
            t0 = time.perf_counter_ns()
            c.enqueue(queue, body)
            lat.append((time.perf_counter_ns() - t0) / 1e6)
    return lat


# -- RabbitMQ clients (pika, as its users write them) --------------------------------------
_QQ = {"x-queue-type": "quorum"}


def _rabbit_declare(port: int, queue: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    conn.channel().queue_declare(queue, durable=True, arguments=_QQ)
    conn.close()


def rabbit_publish(port: int, queue: str, count: int, payload: int, rate: float = 0.0,
                   stamp: bool = False) -> dict[str, Any]:
    """Publish `count` persistent messages with confirms, at most WINDOW unconfirmed
    (pika's asynchronous SelectConnection: the way to keep a window of confirms)."""
    import pika
    from pika.spec import Basic

    body = b"x" * payload
    pad = body[8:]
    props = pika.BasicProperties(delivery_mode=2)
    st = {"sent": 0, "confirmed": 0, "nacked": 0, "last": 0, "t0": 0.0, "t1": 0.0}
    holder: dict[str, Any] = {}

    def publish_more() -> None:
        ch = holder["ch"]
        while st["sent"] < count and st["sent"] - st["confirmed"] < WINDOW:
            if rate:
                due = st["t0"] + st["sent"] / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    holder["conn"].ioloop.call_later(delay, publish_more)
                    return
            ch.basic_publish("", queue, _TS.pack(time.monotonic_ns()) + pad if stamp else body, props)
            st["sent"] += 1

    def on_confirm(frame: Any) -> None:
        m = frame.method
        tag = m.delivery_tag
        n = tag - st["last"] if m.multiple else 1
        st["last"] = max(st["last"], tag)
        st["confirmed"] += n
        if isinstance(m, Basic.Nack):
            st["nacked"] += n
        if st["confirmed"] >= count:
            st["t1"] = time.perf_counter()
            holder["conn"].close()
        else:
            publish_more()

    def on_declared(_f: Any) -> None:
        st["t0"] = time.perf_counter()
        publish_more()

    def on_channel(ch: Any) -> None:
        holder["ch"] = ch
        ch.confirm_delivery(on_confirm)
        ch.queue_declare(queue, durable=True, arguments=_QQ, callback=on_declared)

    conn = pika.SelectConnection(
        pika.ConnectionParameters("127.0.0.1", port),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda c, e: c.ioloop.stop(),
        on_close_callback=lambda c, e: c.ioloop.stop(),
    )
    holder["conn"] = conn
    conn.ioloop.start()
    if st["confirmed"] < count:
        raise RuntimeError(f"RabbitMQ confirmed {st['confirmed']} of {count}")
    return {"messages": count, "seconds": st["t1"] - st["t0"], "errors": st["nacked"]}


def rabbit_calls(port: int, queue: str, count: int, payload: int) -> list[float]:
    """`count` persistent publishes one at a time on a confirming channel (each
    `basic_publish` returns once the broker confirmed it); ms per call."""
    import pika

    body = b"x" * payload
    props = pika.BasicProperties(delivery_mode=2)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=_QQ)
    ch.confirm_delivery()
    lat: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        ch.basic_publish("", queue, body, props, mandatory=False)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
    conn.close()
    return lat


def rabbit_consume(port: int, queue: str, count: int) -> dict[str, Any]:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    n = [0]

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        ch.basic_ack(method.delivery_tag)
        n[0] += 1
        if n[0] == count:
            ch.stop_consuming()

    t0 = time.perf_counter()
    ch.basic_consume(queue, on_message)
    ch.start_consuming()
    # a synchronous call on the same channel: answered after the acks before it are handled
    left = ch.queue_declare(queue, durable=True, passive=True, arguments=_QQ).method.message_count
    seconds = time.perf_counter() - t0
    conn.close()
    return {"messages": n[0], "seconds": seconds, "left": left}


def rabbit_e2e_consumer(port: int, queue: str, count: int, ready: Callable[[], None]) -> list[float]:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=_QQ)
    ch.basic_qos(prefetch_count=PREFETCH)
    lat: list[float] = []

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        lat.append((time.monotonic_ns() - _TS.unpack_from(body)[0]) / 1e6)
        ch.basic_ack(method.delivery_tag)
        if len(lat) == count:
            ch.stop_consuming()

    ch.basic_consume(queue, on_message)
    ready()
    ch.start_consuming()
    conn.close()
    return lat


# -- one run in a child process --------------------------------------------------------------
def _child(ns: argparse.Namespace) -> int:
    system, workload = ns.child
    addr = ns.addr
    if ns.ca_file:
        DOQ_CA[addr] = ns.ca_file
    port = int(addr) if system == "rabbitmq" else 0
    out: dict[str, Any]
    if workload == "producer":
        if system == "rabbitmq":
            out = rabbit_publish(port, ns.queue, ns.count, ns.payload_bytes)
        else:
            out = doq_produce(addr, ns.queue, ns.count, ns.payload_bytes)
    elif workload == "prefill":
        if system == "rabbitmq":
            rabbit_publish(port, ns.queue, ns.count, ns.payload_bytes)
        else:
            doq_prefill(addr, ns.queue, ns.count, ns.payload_bytes)
        out = {}
    elif workload == "consumer":
        if system == "rabbitmq":
            out = rabbit_consume(port, ns.queue, ns.count)
        else:
            out = doq_consume(addr, ns.queue, ns.count)
    elif workload == "calls":
        if system == "rabbitmq":
            lat = rabbit_calls(port, ns.queue, ns.count, ns.payload_bytes)
        else:
            lat = doq_calls(addr, ns.queue, ns.count, ns.payload_bytes)
        seconds = sum(lat) / 1000
        lat.sort()
        out = {"messages": len(lat), "calls_per_s": round(len(lat) / seconds, 1) if seconds else None,
               "p50_ms": _pct(lat, 50), "p90_ms": _pct(lat, 90), "p99_ms": _pct(lat, 99),
               "max_ms": round(lat[-1], 3) if lat else None}
    elif workload == "e2e-consumer":
        def ready() -> None:
            print("ready", flush=True)

        if system == "rabbitmq":
            lat = rabbit_e2e_consumer(port, ns.queue, ns.count, ready)
        else:
            lat = doq_e2e_consumer(addr, ns.queue, ns.count, ready)
        lat.sort()
        out = {"messages": len(lat), "p50_ms": _pct(lat, 50), "p90_ms": _pct(lat, 90),
               "p99_ms": _pct(lat, 99), "max_ms": round(lat[-1], 3) if lat else None}
    elif workload == "e2e-producer":
        if system == "rabbitmq":
            rabbit_publish(port, ns.queue, ns.count, ns.payload_bytes, ns.rate, stamp=True)
        else:
            doq_e2e_producer(addr, ns.queue, ns.count, ns.payload_bytes, ns.rate)
        out = {}
    else:
        raise SystemExit(f"unknown workload {workload}")
    print(json.dumps(out), flush=True)
    return 0


def _pct(sorted_ms: list[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    k = max(0, min(len(sorted_ms) - 1, int(round(q / 100 * len(sorted_ms) + 0.5)) - 1))
    return round(sorted_ms[k], 3)


def _child_cmd(system: str, workload: str, addr: str, queue: str, count: int, args: Args) -> list[str]:
    return [sys.executable, "-m", "bench.side_by_side", "--child", system, workload,
            "--addr", addr, "--queue", queue, "--count", str(count),
            "--payload-bytes", str(args.payload_bytes), "--rate", str(args.rate),
            *(["--ca-file", DOQ_CA[addr]] if addr in DOQ_CA else [])]


def _run_child(cmd: list[str], timeout_s: float = 600) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                         env=_env_for(cmd))
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:6])} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# -- the side-by-side run --------------------------------------------------------------------
@dataclass
class Args:
    count: int = 100_000
    consume_count: int = 50_000
    e2e_count: int = 5_000
    calls_count: int = 3_000
    rate: float = 1000.0
    payload_bytes: int = 100
    runs: int = 3
    workloads: tuple[str, ...] = ("producer", "consumer", "e2e", "calls")
    nodes: int = 1


def _delete_queue(system: str, addr: str, queue: str) -> None:
    with contextlib.suppress(Exception):
        if system == "rabbitmq":
            import pika

            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(addr)))
            conn.channel().queue_delete(queue)
            conn.close()
        else:
            with _doq(addr) as c:
                c.delete_queue(queue)


def _measured(server: Server, cmd: list[str]) -> dict[str, Any]:
    """Run a throughput child; its rate, and the server's CPU time per message meanwhile."""
    c0 = server.cpu_s()
    r = _run_child(cmd)
    cpu = server.cpu_s() - c0
    return {"msg_per_s": round(r["messages"] / r["seconds"], 1),
            "server_cpu_us_per_msg": round(cpu * 1e6 / r["messages"], 1) if cpu else None, **r}


def run_once(system: str, server: Server, workload: str, run: int, args: Args) -> dict[str, Any]:
    """One measured run of `workload` against `system` (clients in child processes)."""
    addr = server.addr
    queue = f"sbs-{workload}-{run}-{os.getpid()}"
    try:
        if workload == "producer":
            return _measured(server, _child_cmd(system, "producer", addr, queue, args.count, args))
        if workload == "consumer":
            _run_child(_child_cmd(system, "prefill", addr, queue, args.consume_count, args))
            return _measured(server, _child_cmd(system, "consumer", addr, queue, args.consume_count, args))
        if workload == "calls":
            return _run_child(_child_cmd(system, "calls", addr, queue, args.calls_count, args))
        if workload == "e2e":
            if system == "rabbitmq":
                _rabbit_declare(int(addr), queue)
            else:
                _doq_queue(addr, queue)
            cons_cmd = _child_cmd(system, "e2e-consumer", addr, queue, args.e2e_count, args)
            cons = subprocess.Popen(cons_cmd, stdout=subprocess.PIPE, text=True, env=_env_for(cons_cmd))
            try:
                assert cons.stdout is not None
                if cons.stdout.readline().strip() != "ready":
                    raise RuntimeError("e2e consumer did not start")
                time.sleep(0.5)
                _run_child(_child_cmd(system, "e2e-producer", addr, queue, args.e2e_count, args))
                line = cons.stdout.readline()
                cons.wait(60)
            finally:
                if cons.poll() is None:
                    cons.kill()
                    cons.wait()
            return dict(json.loads(line))
        raise ValueError(workload)
    finally:
        _delete_queue(system, addr, queue)


def _commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, check=False, timeout=10)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def side_by_side(args: Args, systems: list[str], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every workload `args.runs` times on each system (alternating); return the record."""
    record: dict[str, Any] = {"commit": _commit(), "loadavg_before": os.getloadavg(),
                              "args": args.__dict__, "runs": {}}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="doq-sbs-")))
        servers: dict[str, Server] = {}
        if "doq" in systems:
            servers["doq"] = stack.enter_context(doq_server(tmp / "doq", args.nodes))
        if "doq-tls" in systems:
            servers["doq-tls"] = stack.enter_context(doq_server(tmp / "doq-tls", args.nodes, secure=True))
        if "rabbitmq" in systems:
            servers["rabbitmq"] = stack.enter_context(rabbit_server(tmp / "rabbitmq", args.nodes))
        for workload in args.workloads:
            for run in range(args.runs):
                order = systems if run % 2 == 0 else systems[::-1]
                for system in order:
                    r = run_once(system, servers[system], workload, run, args)
                    r["loadavg"] = os.getloadavg()[0]
                    record["runs"].setdefault(f"{system}/{workload}", []).append(r)
                    log(f"{system:9s} {workload:9s} run {run + 1}: {json.dumps(r)}")
    record["loadavg_after"] = os.getloadavg()
    record["summary"] = summarize(record["runs"], systems, args.workloads)
    return record


def summarize(runs: dict[str, list[dict[str, Any]]], systems: list[str],
              workloads: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for w in workloads:
        keys = (["p50_ms", "p99_ms"] if w == "e2e" else ["p50_ms", "p99_ms", "calls_per_s"] if w == "calls"
                else ["msg_per_s", "server_cpu_us_per_msg"])
        for key in keys:
            row: dict[str, Any] = {"workload": w, "figure": key}
            for s in systems:
                row[s] = _median(runs.get(f"{s}/{w}", []), key)
            if row.get("doq") and row.get("rabbitmq"):
                row["doq/rabbitmq"] = round(row["doq"] / row["rabbitmq"], 2)
            if row.get("doq") and row.get("doq-tls"):
                row["doq-tls/doq"] = round(row["doq-tls"] / row["doq"], 3)
            rows.append(row)
    return rows


def format_summary(record: dict[str, Any], systems: list[str]) -> str:
    head = ["workload", "figure", *systems] + [r for r in ("doq/rabbitmq", "doq-tls/doq")
                                               if all(x in systems for x in r.split("/"))]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in record["summary"]:
        lines.append("| " + " | ".join(str(row.get(h, "")) for h in head) + " |")
    lb, la = record["loadavg_before"], record["loadavg_after"]
    lines.append(f"{record['args']['nodes']} node(s) per system; commit {record['commit']}; load average before {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}, "
                 f"after {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; medians of {record['args']['runs']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="side_by_side", description=__doc__.split("\n\n")[0],
                                epilog=INSTALL_HINT.split(":", 1)[1].split(";")[0].strip()
                                + ": RabbitMQ, without which doq is measured alone")
    p.add_argument("--systems", default="doq,rabbitmq",
                   help="comma separated: doq, doq-tls (doq serve --secure: TLS, clients with the CA), rabbitmq")
    p.add_argument("--workloads", default="producer,consumer,e2e,calls",
                   help="comma separated: producer, consumer, e2e, calls")
    p.add_argument("--count", type=int, default=Args.count, help="messages per producer run")
    p.add_argument("--consume-count", type=int, default=Args.consume_count, help="messages per consumer run")
    p.add_argument("--e2e-count", type=int, default=Args.e2e_count, help="messages per e2e run")
    p.add_argument("--calls-count", type=int, default=Args.calls_count,
                   help="calls per `calls` run (one at a time)")
    p.add_argument("--rate", type=float, default=Args.rate, help="e2e producer rate, msg/s")
    p.add_argument("--payload-bytes", type=int, default=Args.payload_bytes)
    p.add_argument("--runs", type=int, default=Args.runs)
    p.add_argument("--nodes", type=int, default=Args.nodes, choices=(1, 3),
                   help="nodes per system: 3 runs a doq cluster and a RabbitMQ cluster (quorum "
                        "queues with 3 replicas), clients on node 1 (the leader)")
    p.add_argument("--json", metavar="FILE", help="also write the whole record here")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--addr", help=argparse.SUPPRESS)
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--ca-file", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        return _child(ns)
    systems = [s for s in ns.systems.split(",") if s]
    if "rabbitmq" in systems and not rabbit_installed():
        print(INSTALL_HINT, file=sys.stderr)
        systems.remove("rabbitmq")
    if not systems:
        return 2
    args = Args(ns.count, ns.consume_count, ns.e2e_count, ns.calls_count, ns.rate, ns.payload_bytes,
                ns.runs, tuple(w for w in ns.workloads.split(",") if w), ns.nodes)
    record = side_by_side(args, systems)
    print(format_summary(record, systems))
    if ns.json:
        Path(ns.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
