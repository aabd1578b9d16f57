"""Where one call's time goes on a cluster: per-stage stamps of `client.enqueue()` one at a time.

`python bench/call_stages.py [--nodes 3] [--calls 2000] [--runs 1]` starts a fresh
cluster as `bench/side_by_side.py` does (`doq_server`), every node started with probes
(`install`) that stamp, on the machine's monotonic clock (shared by the processes), each
Raft log index at each point of its path, then makes `--calls` enqueues one at a time
from this process and prints, per step, the p50 / p90 of the time from the step before:

- leader: `api_in` (the service's `enqueue`), `prop` (`propose_nowait`), `rd_ent` (the
  Ready that appends the entry), `send_app` (its AppendEntries queued on the transport),
  `wr_app` (that frame written to a follower's gRPC stream; `tk_app`: taken into a
  frame), `sync_ent` (the entry's
  fdatasync done), `wr_end` (the leader's write of that Ready back on the loop);
- follower (the first to answer): `recv_app`, `f_rd_ent`, `f_sync`, `f_send_resp`,
  `f_wr_resp`;
- leader: `recv_resp` (the first answer read), `rd_com` (the Ready that commits it),
  `ans` (the apply answered, on the apply thread), `resolved` (on the loop), `api_out`,
  then the client's return.

The probes wrap private functions of `doq.node.raft_node` and `doq.node.transport` in the
measured processes only (a measuring tool, not a supported hook: they may need mending
when those functions change). Each costs a few µs per call.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/NAME.py`: this checkout first

ENV = "DOQ_CALL_STAGES"  # where a probed process writes its stamps: <prefix>-<pid>.json
BOOT = ("import runpy, sys\nfrom bench import call_stages\ncall_stages.install()\n"
        "mod = sys.argv[1]\nsys.argv = [mod, *sys.argv[2:]]\n"
        "runpy.run_module(mod, run_name='__main__', alter_sys=True)\n")


def install() -> None:  # noqa: C901 - one closure per probe point
    """Wrap the functions of the path with stamps; write them at exit and on SIGUSR1."""
    from doq.node import raft_node, transport
    from doq.raft.codec import decode_message
    from doq.raft.types import MessageType
    from doq.service import api

    stamps: list[tuple[str, int, int]] = []  # (stage, log index or -1, monotonic ns)
    now = time.monotonic_ns
    add = stamps.append

    def dump(*_: object) -> None:
        with open(f"{os.environ[ENV]}-{os.getpid()}.json", "w") as f:
            json.dump({"stamps": stamps}, f)

    atexit.register(dump)
    signal.signal(signal.SIGUSR1, dump)

    node_cls = raft_node.RaftNode
    orig_prop = node_cls.propose_nowait

    def propose_nowait(self: Any, command: Any) -> Any:
        add(("prop", -1, now()))
        return orig_prop(self, command)

    node_cls.propose_nowait = propose_nowait  # type: ignore[method-assign]

    orig_ready = node_cls._handle_ready

    async def handle_ready(self: Any, core: Any, rd: Any) -> None:
        t = now()
        if rd.entries:
            add(("rd_ent", rd.entries[-1].index, t))
        if rd.committed_entries:
            add(("rd_com", rd.committed_entries[-1].index, t))
        await orig_ready(self, core, rd)
        t = now()
        if rd.entries:
            add(("wr_end", rd.entries[-1].index, t))
        if rd.committed_entries:
            add(("com_end", rd.committed_entries[-1].index, t))

    node_cls._handle_ready = handle_ready  # type: ignore[method-assign]

    orig_append = node_cls._append_log

    def append_log(self: Any, job: Any) -> None:
        if job.entries:
            add(("sync0", job.entries[-1].index, now()))
        orig_append(self, job)
        if job.entries:
            add(("sync_ent", job.entries[-1].index, now()))

    node_cls._append_log = append_log  # type: ignore[method-assign]

    orig_commit = node_cls._commit_state

    def commit_state(self: Any, job: Any, *a: Any, **k: Any) -> None:
        key = job.committed[-1].index if job.committed else (job.entries[-1].index if job.entries else -1)
        add(("lmdb0", key, now()))
        if job.answer is not None:
            answer = job.answer

            def stamped(committed: Any, results: Any) -> None:
                add(("ans", committed[-1].index, now()))
                answer(committed, results)

            job.answer = stamped
        orig_commit(self, job, *a, **k)
        add(("lmdb1", key, now()))

    node_cls._commit_state = commit_state  # type: ignore[method-assign]

    orig_resolve = node_cls._resolve_committed

    def resolve(self: Any, committed: Any, results: Any) -> None:
        if committed:
            add(("resolved", committed[-1].index, now()))
        orig_resolve(self, committed, results)

    node_cls._resolve_committed = resolve  # type: ignore[method-assign]

    orig_on = node_cls._on_messages

    def stamp(messages: Any, app: str, resp: str) -> None:
        """Stamp each append (by its last entry) as `app`, each accepting answer as `resp`."""
        t = now()
        for m in messages:
            if m.type == MessageType.APP and m.entries:
                add((app, m.entries[-1].index, t))
            elif m.type == MessageType.APP_RESP and not m.reject:
                add((resp, m.index, t))

    def on_messages(self: Any, frame: Any) -> None:
        stamp(frame.messages, "recv_app", "recv_resp")
        orig_on(self, frame)

    node_cls._on_messages = on_messages  # type: ignore[method-assign]

    tr = transport.TcpRaftTransport
    orig_send = tr.send

    def send(self: Any, messages: Any) -> None:
        stamp(messages, "send_app", "send_resp")
        orig_send(self, messages)

    tr.send = send  # type: ignore[method-assign]

    orig_take = transport._Peer.take

    def take(self: Any, max_bytes: int) -> list[bytes]:
        out = orig_take(self, max_bytes)
        keys = []
        for b in out:
            m = decode_message(b)
            if m.type == MessageType.APP and m.entries:
                keys.append(("wr_app", m.entries[-1].index))
            elif m.type == MessageType.APP_RESP and not m.reject:
                keys.append(("wr_resp", m.index))
        self._probe_keys = keys
        t = now()
        for stage, key in keys:  # taken into a frame
            add(("tk" + stage[2:], key, t))
        return out

    transport._Peer.take = take  # type: ignore[method-assign]
    orig_pump = tr._pump

    async def pump(self: Any, peer: Any, reader: Any, writer: Any) -> None:
        orig_write = writer.writelines

        def writelines(data: Any) -> None:
            orig_write(data)  # handed to the socket (or its buffer)
            t = now()
            for stage, key in getattr(peer, "_probe_keys", ()):
                add((stage, key, t))

        writer.writelines = writelines
        await orig_pump(self, peer, reader, writer)

    tr._pump = pump  # type: ignore[method-assign]

    orig_enq = api.QueueService.enqueue

    async def enqueue(self: Any, *a: Any, **k: Any) -> Any:
        add(("api_in", -1, now()))
        try:
            return await orig_enq(self, *a, **k)
        finally:
            add(("api_out", -1, now()))

    api.QueueService.enqueue = enqueue  # type: ignore[method-assign]


LEADER_STEPS = ("api_in", "prop", "rd_ent", "send_app", "wr_app", "recv_app", "f_rd_ent", "f_sync",
                "f_send_resp", "f_wr_resp", "recv_resp", "rd_com", "lmdb0", "ans", "resolved", "api_out", "c_end")


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else float("nan")


def _first_after(times: list[int], t: int, until: int) -> int | None:
    for x in times:
        if t <= x <= until:
            return x
    return None


def report(prefix: str, leader_pid: int, calls: list[tuple[int, int]]) -> dict[str, Any]:
    """Join the stamps of every node with the client's (start, end) of each call."""
    per: dict[int, dict[tuple[str, int], list[int]]] = {}
    for f in Path(prefix).parent.glob(Path(prefix).name + "-*.json"):
        pid = int(f.stem.rsplit("-", 1)[1])
        d: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
        for stage, key, t in json.loads(f.read_text())["stamps"]:
            d[(stage, key)].append(t)
        per[pid] = d
    lead = per.pop(leader_pid)
    followers = list(per.values())
    unkeyed = {s: sorted(v for (st, k), vs in lead.items() if st == s and k == -1 for v in vs)
               for s in ("api_in", "prop", "api_out")}
    ent_ready = sorted((ts[0], k) for (s, k), ts in lead.items() if s == "rd_ent")
    rows = []
    for t0, t1 in calls:
        idx = next((k for t, k in ent_ready if t0 <= t <= t1), None)
        if idx is None:
            continue
        at: dict[str, int | None] = {"c_start": t0}
        at["api_in"] = _first_after(unkeyed["api_in"], t0, t1)
        at["prop"] = _first_after(unkeyed["prop"], t0, t1)

        def first(d: dict[tuple[str, int], list[int]], stage: str, idx: int = idx,
                  t0: int = t0, t1: int = t1) -> int | None:
            ts = [t for t in d.get((stage, idx), []) if t0 <= t <= t1 + 50_000_000]
            return min(ts) if ts else None

        at["rd_ent"] = first(lead, "rd_ent")
        at["send_app"] = first(lead, "send_app")
        at["sync_ent"] = first(lead, "sync_ent")
        at["wr_end"] = first(lead, "wr_end")
        at["recv_resp"] = first(lead, "recv_resp")
        # the follower whose answer came first
        best = None
        for fd in followers:
            tr = first(fd, "wr_resp") or first(fd, "send_resp")
            if tr is not None and (best is None or tr < best[0]):
                best = (tr, fd)
        if best is None:
            continue
        fd = best[1]
        at["wr_app"] = min((t for t in lead.get(("wr_app", idx), []) or lead.get(("tk_app", idx), [])
                            if t0 <= t <= t1), default=None)
        at["recv_app"] = first(fd, "recv_app")
        at["f_rd_ent"] = first(fd, "rd_ent")
        at["f_sync"] = first(fd, "sync_ent")
        at["f_send_resp"] = first(fd, "send_resp")
        at["f_wr_resp"] = first(fd, "wr_resp") or first(fd, "tk_resp")
        at["f_wr_end"] = first(fd, "wr_end")
        at["rd_com"] = first(lead, "rd_com")
        lmdb0 = [t for t in lead.get(("lmdb0", idx), []) if at["rd_com"] is not None and t >= at["rd_com"]]
        at["lmdb0"] = min(lmdb0) if lmdb0 else None
        at["ans"] = first(lead, "ans")
        at["resolved"] = first(lead, "resolved")
        at["api_out"] = _first_after(unkeyed["api_out"], at["resolved"] or t0, t1)
        at["c_end"] = t1
        rows.append(at)
    steps = []
    last = "c_start"
    for s in LEADER_STEPS:
        ds = [(r[s] - r[last]) / 1e6 for r in rows if r.get(s) is not None and r.get(last) is not None]  # type: ignore[operator]
        steps.append({"step": f"{last} -> {s}", "p50_ms": round(_pct(ds, 50), 3), "p90_ms": round(_pct(ds, 90), 3)})
        last = s
    extra = {}
    for a, b in (("rd_ent", "sync_ent"), ("sync_ent", "wr_end"), ("rd_ent", "wr_end"), ("recv_resp", "rd_com"),
                 ("wr_end", "rd_com"), ("f_rd_ent", "f_wr_end"), ("send_app", "recv_resp"), ("prop", "resolved")):
        ds = [(r[b] - r[a]) / 1e6 for r in rows if r.get(a) is not None and r.get(b) is not None]  # type: ignore[operator]
        extra[f"{a} -> {b}"] = {"p50_ms": round(_pct(ds, 50), 3), "p90_ms": round(_pct(ds, 90), 3)}
    total = [(t1 - t0) / 1e6 for t0, t1 in calls]
    return {"calls": len(calls), "joined": len(rows), "call_p50_ms": round(_pct(total, 50), 3),
            "call_p90_ms": round(_pct(total, 90), 3), "steps": steps, "spans": extra}


def run(nodes: int, count: int) -> dict[str, Any]:
    from bench.side_by_side import _doq, _doq_queue, doq_server

    tmp = Path(tempfile.mkdtemp(prefix="doq-calls-"))
    prefix = str(tmp / "stamps")
    os.environ[ENV] = prefix
    boot = tmp / "boot.py"
    boot.write_text(BOOT)
    launcher = (sys.executable, str(boot), "doq")
    env_pp = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), env_pp) if p)
    with doq_server(tmp, nodes=nodes, launcher=launcher) as srv:
        _doq_queue(srv.addr, "calls")
        calls: list[tuple[int, int]] = []
        with _doq(srv.addr) as c:
            c.get_queue("calls")
            for _ in range(count):
                t0 = time.monotonic_ns()
                c.enqueue("calls", b"x" * 100)
                calls.append((t0, time.monotonic_ns()))
        for pid in srv.pids:
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
        leader_pid = srv.pids[0]
    return report(prefix, leader_pid, calls[count // 10:])  # the first tenth warms up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--runs", type=int, default=1)
    ns = p.parse_args()
    for _ in range(ns.runs):
        load = os.getloadavg()[0]
        out = run(ns.nodes, ns.calls)
        out["load_before"] = round(load, 2)
        out["load_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
