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
