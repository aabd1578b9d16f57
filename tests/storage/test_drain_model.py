"""Draining delayed and fair queues on a real StateStore (LMDB in a temp dir), checked
against a model: every message delivered once, in the queue's order, whatever the store's
removals (acks noted gone, compactions spread over commits, a restart midway) do; and the
cursor helpers that delete keys (`_walk` with `pop`, `_drop_keys`) against a dict.

Real: LMDB, the store, the machine. Faked: nothing; the sweep's thresholds are made tiny
(module attributes, restored after each example) so that compactions start, run over
several commits and finish within a few hundred messages."""

from __future__ import annotations

import contextlib
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import doq.storage.state as S
from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.state import StateStore, _drop_keys, _walk

T0 = 1_700_000_000_000
_U64 = struct.Struct(">Q")


@contextlib.contextmanager
def _tiny_sweeps(visit: int, chunk: int) -> Iterator[None]:
    """Compactions and collections start at a few noted keys and take `visit` / `chunk`
    keys per commit (the module's constants, restored afterwards)."""
    names = {"MIN_COMPACT": 8, "COMPACT_FRACTION": 4, "MIN_COLLECT": 8, "SWEEP_VISIT": visit,
             "SWEEP_CHUNK": chunk, "SWEEP_GATHER": chunk}
    old = {n: getattr(S, n) for n in names}
    try:
        for n, v in names.items():
            setattr(S, n, v)
        yield
    finally:
        for n, v in old.items():
            setattr(S, n, v)


_keys = st.lists(st.integers(0, 60), max_size=40)


@settings(max_examples=60, deadline=None)
@given(present=st.sets(st.integers(0, 60)), keys=_keys, ascending=st.booleans())
def test_walk_pop_and_drop_keys_delete_exactly_the_keys_given(present: set[int], keys: list[int],
                                                                ascending: bool) -> None:
    """`_walk(pop=True)` returns each key's value before the call (None if absent or
    already taken by the same call), in the order given, and deletes those keys only;
    `_drop_keys` deletes the same. Any order, duplicates and absent keys included."""
    if ascending:
        keys = sorted(keys)
    raw = [b"M\x00\x01q" + _U64.pack(k) for k in keys]
    with tempfile.TemporaryDirectory() as tmp:
        env = open_env(Path(tmp), map_size=1 << 24)
        for drop in (False, True):
            db = env.open_db(b"state_messages" if drop else b"state_queues")
            model = {b"M\x00\x01q" + _U64.pack(k): b"v%d" % k for k in present}
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(sorted(model.items()))
                cur = txn.cursor(db=db)
                if drop:
                    _drop_keys(cur, raw)
                else:
                    got = _walk(cur, raw, pop=True)
                    want = [model.pop(k, None) for k in raw]
                    assert got == want
                for k in raw:
                    model.pop(k, None)
                assert {bytes(k): bytes(v) for k, v in txn.cursor(db=db).iternext()} == model
        env.close()


def _entry(index: int, *cmds: c.Command) -> tuple[int, bytes]:
    return index, encode_batch(c.CommandBatch(T0 + index, list(cmds)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["random", "ties", "fair-blocks"]),
    n=st.integers(40, 400),
    batch=st.integers(1, 60),
    visit=st.integers(2, 40),
    chunk=st.integers(1, 16),
    restart_at=st.integers(0, 30),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_drain_delivers_every_message_once_in_order_whatever_the_sweeps(
        kind: str, n: int, batch: int, visit: int, chunk: int, restart_at: int, seed: int) -> None:
    """A queue filled with `n` messages (random priorities, many ties, or a fair queue's
    groups filled as blocks) and drained by commits that ack the previous deliveries and
    take `batch` more, with compactions of the acked bodies spread over commits and a
    restart after `restart_at` commits: every message is delivered exactly once, a
    delayed queue's in (priority, id) order and a fair queue's one per group per round
    (groups by name, ids ascending inside one); the store ends as one that never swept
    (same changes and dump), holding no acked body once the sweeps are done."""
    import random

    rnd = random.Random(seed)
    fair = kind == "fair-blocks"
    per_group = max(1, n // 7)
    if kind == "random":
        prios = [rnd.randrange(10**6) for _ in range(n)]
    elif kind == "ties":
        prios = [rnd.randrange(3) for _ in range(n)]
    else:
        prios = [0] * n
    groups = [f"g{i // per_group:03d}" for i in range(n)] if fair else []
    fill = [_entry(1, c.CreateQueue("q", "fair" if fair else "delayed", QueueSettings()))]
    for i in range(0, n, 97):  # several entries, columns as producers send them
        fill.append(_entry(len(fill) + 1, c.EnqueueColumns(
            "q", [b"m%d" % j for j in range(i, min(n, i + 97))],
            groups=groups[i : i + 97], priorities=[] if fair else prios[i : i + 97])))
    with tempfile.TemporaryDirectory() as tmp, _tiny_sweeps(visit, chunk):
        envs = {name: open_env(Path(tmp) / name, map_size=1 << 26) for name in ("swept", "unswept")}
        stores = {name: StateStore(env) for name, env in envs.items()}
        for store in stores.values():
            with store.write() as txn:
                store.apply_entries(txn, fill)
        delivered: list[tuple[int, int, str, bytes]] = []
        prev: tuple[list[int], list[int]] = ([], [])
        index = len(fill)
        commits = 0
        while True:
            index += 1
            cmds: list[c.Command] = [c.Dequeue("q", batch, visibility_timeout_ms=3_600_000)]
            if prev[0]:
                cmds.insert(0, c.Ack("q", prev[0], prev[1]))
            ent = [_entry(index, *cmds)]
            outs = {}
            for name, store in stores.items():
                S.MIN_COMPACT = 8 if name == "swept" else 1 << 40
                S.MIN_COLLECT = 8 if name == "swept" else 1 << 40
                with store.write() as txn:
                    outs[name] = store.apply_entries(txn, ent)[0]
            assert repr(outs["swept"]) == repr(outs["unswept"])
            _check_ahead(stores["swept"])
            views = outs["swept"][-1]
            assert isinstance(views, list)
            if prev[0]:
                assert outs["swept"][0] == [None] * len(prev[0])  # every ack took
            delivered += [(v.priority, v.id, v.group, v.content) for v in views]
            prev = ([v.id for v in views], [v.lease_id for v in views])
            commits += 1
            if commits == restart_at:  # a restart: the notes are read back, a compaction starts again
                envs["swept"].close()
                envs["swept"] = open_env(Path(tmp) / "swept", map_size=1 << 26)
                stores["swept"] = StateStore(envs["swept"])
            if not views:
                break
        ids = [d[1] for d in delivered]
        assert sorted(ids) == list(range(1, n + 1))  # each once: none lost, none twice
        assert all(d[3] == b"m%d" % (d[1] - 1) for d in delivered)  # each with its own body
        if not fair:
            assert [(d[0], d[1]) for d in delivered] == sorted(zip(prios, range(1, n + 1), strict=True))
        else:
            by_group: dict[str, list[int]] = {}
            for _, id_, g, _ in delivered:
                by_group.setdefault(g, []).append(id_)
            assert all(v == sorted(v) for v in by_group.values())
            # round-robin: in every prefix, groups still holding messages differ by at most one delivery
            left = {g: len(v) for g, v in by_group.items()}
            taken = dict.fromkeys(left, 0)
            for _, _, g, _ in delivered:
                taken[g] += 1
                left[g] -= 1
                busy = [taken[h] for h in taken if left[h] > 0 or h == g]
                assert max(busy) - min(busy) <= 1
        swept, unswept = stores["swept"], stores["unswept"]
        assert list(swept.iter_changes(0)) == list(unswept.iter_changes(0))
        assert swept.dump_state_bytes() == unswept.dump_state_bytes()
        S.MIN_COMPACT = S.MIN_COLLECT = 1  # whatever is left goes too
        for _ in range(400):  # ticks until the sweeps are done
            if swept._compacting is None and swept._collecting is None and not swept._sink.gone:
                break
            index += 1
            with swept.write() as txn:
                swept.apply_entries(txn, [_entry(index, c.Tick())])
        assert swept._compacting is None and not swept._sink.gone
        with envs["swept"].begin() as txn:
            msgs = txn.stat(envs["swept"].open_db(b"state_messages", txn=txn))["entries"]
        assert msgs == 0  # every body acked, every one removed
        for env in envs.values():
            env.close()


@contextlib.contextmanager
def _tiny_read_ahead(read: int, most: int) -> Iterator[None]:
    """The read-ahead takes `read` bodies at a time and holds at most `most`."""
    old = S.AHEAD_READ, S.AHEAD_MAX
    S.AHEAD_READ, S.AHEAD_MAX = read, most
    try:
        yield
    finally:
        S.AHEAD_READ, S.AHEAD_MAX = old


def _check_ahead(store: StateStore) -> None:
    """Every body read ahead is the key's stored body (the sink's invariant)."""
    db = store._kind_db[S._MSG]
    with store.env.begin() as txn:
        for k, v in store._sink.ahead.items():
            assert txn.get(k, db=db) == v, k


_ops = st.lists(st.one_of(
    st.tuples(st.just("enq"), st.integers(1, 150), st.integers(0, 2**32)),
    st.tuples(st.just("deq"), st.integers(2, 8), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 100), st.just(0)),
    st.tuples(st.just("nack"), st.integers(0, 100), st.integers(0, 3)),
    st.tuples(st.just("upd"), st.integers(0, 10**6), st.integers(-5, 5)),
    st.tuples(st.just("del"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("purge"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fair=st.booleans(), read=st.integers(1, 24), most=st.integers(1, 60), ops=_ops)
def test_deliveries_with_read_ahead_are_those_without(fair: bool, read: int, most: int,
                                                       ops: list[tuple[str, int, int]]) -> None:
    """The same entries applied to a store that reads bodies ahead (tiny sizes, so reads
    ahead start over, overflow and go stale) and to one that does not: the same results
    (every delivered body, priority, order, lease), the same changes and dump; after every
    commit each body held ahead is the key's stored body. Between deliveries: enqueues with
    priorities ahead of those read, acks, nacks (released, delayed, with a new priority),
    priority updates, deletes, purges, deliveries that remove (ack), restarts."""
    import random

    with tempfile.TemporaryDirectory() as tmp, _tiny_read_ahead(read, most):
        envs = {name: open_env(Path(tmp) / name, map_size=1 << 26) for name in ("ahead", "plain")}
        stores = {name: StateStore(env) for name, env in envs.items()}
        stores["plain"]._sink.upcoming = None
        index = 0
        n_msgs = 0
        inflight: dict[int, int] = {}  # id -> lease id (from the deliveries)

        def apply(*cmds: c.Command) -> list[object]:
            nonlocal index
            index += 1
            ent = [_entry(index, *cmds)]
            outs = {}
            for name, store in stores.items():
                with store.write() as txn:
                    outs[name] = store.apply_entries(txn, ent)[0]
            assert repr(outs["ahead"]) == repr(outs["plain"])
            _check_ahead(stores["ahead"])
            return outs["ahead"]

        def target(a: int) -> int:
            """A message id: three times in four one whose body is read ahead, if any."""
            held = sorted(stores["ahead"]._sink.ahead)
            if held and a % 4:
                return int.from_bytes(held[a % len(held)][-8:], "big")
            return 1 + a % n_msgs

        apply(c.CreateQueue("q", "fair" if fair else "delayed", QueueSettings()))
        rnd = random.Random(len(ops))
        for op, a, b in [("enq", 120, len(ops)), ("deq", 4, 0), *ops]:  # bodies read ahead from the start
            if op == "enq":
                r = random.Random(b)
                contents = [b"m%d" % (n_msgs + j) for j in range(a)]
                n_msgs += a
                apply(c.EnqueueColumns("q", contents, groups=[f"g{r.randrange(4)}" for _ in range(a)] if fair else [],
                                       priorities=[] if fair else [r.randrange(-50, 50) for _ in range(a)]))
            elif op == "deq":
                out = apply(c.Dequeue("q", a, ack=b, visibility_timeout_ms=3_600_000))
                views = out[0]
                assert isinstance(views, list)
                if not b:
                    inflight.update((v.id, v.lease_id) for v in views)
            elif op == "ack" and inflight:
                ids = sorted(inflight)[: max(1, len(inflight) * a // 100)]
                apply(c.Ack("q", ids, [inflight.pop(i) for i in ids]))
            elif op == "nack" and inflight:
                id_ = rnd.choice(sorted(inflight))
                lid = inflight.pop(id_)
                nack = [c.Nack("q", id_, lid, release=True), c.Nack("q", id_, lid),
                        c.Nack("q", id_, lid, delay_ms=1), c.Nack("q", id_, lid, priority=-100)][b]
                apply(nack)
            elif op == "upd" and n_msgs:
                apply(c.UpdatePriority("q", target(a), b * 30))
            elif op == "del" and n_msgs:
                id_ = target(a)
                inflight.pop(id_, None)
                apply(c.DeleteMessage("q", id_))
            elif op == "purge":
                inflight.clear()
                apply(c.PurgeQueue("q"))
            elif op == "restart":
                envs["ahead"].close()
                envs["ahead"] = open_env(Path(tmp) / "ahead", map_size=1 << 26)
                stores["ahead"] = StateStore(envs["ahead"])
            apply(c.Tick())
        while True:  # the rest, delivered the same
            views = apply(c.Dequeue("q", 7, visibility_timeout_ms=3_600_000))[0]
            if not views:
                break
        assert list(stores["ahead"].iter_changes(0)) == list(stores["plain"].iter_changes(0))
        assert stores["ahead"].dump_state_bytes() == stores["plain"].dump_state_bytes()
        for env in envs.values():
            env.close()


def test_a_delivery_takes_the_bodies_read_ahead_and_reads_the_rest() -> None:
    """A scattered delivery that misses reads the next `AHEAD_READ` deliveries' bodies
    ahead; the deliveries that follow take theirs from there (no read), each with its own
    body; an aborted write empties it (it may hold what the abort undid)."""
    import random

    rnd = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, _tiny_read_ahead(64, 256):
        env = open_env(Path(tmp) / "s", map_size=1 << 26)
        store = StateStore(env)
        prios = [rnd.randrange(10**6) for _ in range(300)]
        ents = [_entry(1, c.CreateQueue("q", "delayed", QueueSettings())),
                _entry(2, c.EnqueueColumns("q", [b"m%d" % i for i in range(300)], groups=[], priorities=prios))]
        with store.write() as txn:
            store.apply_entries(txn, ents)
        order = [i for _, i in sorted(zip(prios, range(1, 301), strict=True))]
        sink = store._sink
        got: list[int] = []
        for index in range(3, 8):
            before = dict(sink.ahead)
            with store.write() as txn:
                views = store.apply_entries(txn, [_entry(index, c.Dequeue("q", 10, visibility_timeout_ms=3_600_000))])[0][0]
            assert isinstance(views, list)
            assert all(v.content == b"m%d" % (v.id - 1) for v in views)
            got += [v.id for v in views]
            keys = [K.message_key("q", v.id) for v in views]
            if index == 3:  # nothing ahead: read, then the next 64 read ahead
                assert not before and sorted(sink.ahead) == sorted(K.message_key("q", i) for i in order[10:74])
            else:  # taken from what was read ahead, nothing read
                assert all(k in before for k in keys) and len(sink.ahead) == len(before) - 10
            _check_ahead(store)
        assert got == order[:50]
        with contextlib.suppress(RuntimeError), store.write() as txn:
            store.apply_entries(txn, [_entry(8, c.Dequeue("q", 10, visibility_timeout_ms=3_600_000))])
            raise RuntimeError("abort")
        assert not sink.ahead
        env.close()
