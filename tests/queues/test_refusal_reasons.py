"""The reasons (the machine-readable part of an error users and clients branch on) of
refusals the machine makes alone, and the field its message names; each refusal changes
nothing (pure; in-memory store)."""

from __future__ import annotations

from typing import Any

from doq.errors import AlreadyExists, DoqError, InvalidArgument
from doq.queues import commands as c
from doq.queues.machine import QueueMachine
from doq.queues.model import QueueSettings
from doq.queues.store import MemoryStore

T0 = 1_700_000_000_000


def _machine() -> tuple[QueueMachine, list[int]]:
    m = QueueMachine(MemoryStore())
    return m, [0]


def _apply(m: QueueMachine, index: list[int], cmd: Any) -> object:
    index[0] += 1
    return m.apply(index[0], c.CommandBatch(T0, [cmd]))[0]


def test_creating_an_existing_queue_with_other_settings_is_refused_queue_exists() -> None:
    m, i = _machine()
    _apply(m, i, c.CreateQueue("q", "delayed", QueueSettings()))
    res = _apply(m, i, c.CreateQueue("q", "delayed", QueueSettings(max_attempts=3)))
    assert isinstance(res, AlreadyExists) and res.reason == "QUEUE_EXISTS"
    assert m.queues["q"].info().settings == QueueSettings()


def test_a_dead_letter_queue_that_is_not_a_string_is_refused_invalid_settings() -> None:
    m, i = _machine()
    res = _apply(m, i, c.CreateQueue("q", "delayed", QueueSettings(dead_letter_queue=5)))  # type: ignore[arg-type]
    assert isinstance(res, InvalidArgument) and res.reason == "INVALID_SETTINGS"
    assert "dead_letter_queue" in res.message and m.queues == {}


def test_a_dedup_id_that_is_not_valid_unicode_is_refused_naming_it() -> None:
    m, i = _machine()
    _apply(m, i, c.CreateQueue("q", "delayed", QueueSettings()))
    res = _apply(m, i, c.Enqueue("q", [c.EnqueueItem(b"x", dedup_id="\ud800")]))
    errs = [r for r in (res if isinstance(res, list) else [res]) if isinstance(r, DoqError)]
    assert [(e.reason, e.message) for e in errs] == [("INVALID_ARGUMENT", "dedup_id is not valid unicode")]
    assert m.queues["q"].info().stats.total == 0


def test_cancelling_a_redrive_a_queue_never_had_is_refused_naming_the_queue() -> None:
    m, i = _machine()
    _apply(m, i, c.CreateQueue("q", "delayed", QueueSettings()))
    res = _apply(m, i, c.CancelRedrive("q"))
    assert isinstance(res, DoqError)
    assert (res.reason, res.message) == ("REDRIVE_NOT_FOUND", "queue 'q' has no redrive")
