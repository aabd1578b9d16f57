"""Typed results of proposed commands.

A node resolves a proposal with the state machine's result for its command: the result
object, or a `DoqError` instance the machine answered with (see `doq.node.base.Node`).
These functions turn that `object` into the type the command promises (see
`doq.queues.commands`), raising the machine's error, or `TypeError` if the result is not
of the promised type (a bug: the command and its result disagree). The facade and the
sessions read every result through them, never through `isinstance` chains.
"""

from __future__ import annotations

from typing import TypeVar, cast

from doq.errors import DoqError
from doq.queues.model import EnqueueColumnsResult, EnqueueResult, MessageView

T = TypeVar("T")

ItemResults = list[EnqueueResult | DoqError]
"""`Enqueue`'s result: one per item, in order (an item may fail alone)."""
AckResults = list[DoqError | None]
"""`Ack`'s result: None (acked) or the error, one per id, in order."""


def expect(result: object, kind: type[T]) -> T:
    """`result` as a `kind`; raises it if it is a DoqError."""
    if type(result) is kind:  # the hot path: an exact type, no MRO walk
        return cast(T, result)
    if isinstance(result, DoqError):
        raise result
    if isinstance(result, kind):
        return result
    raise TypeError(f"a command promised {kind.__name__}, its result is {type(result).__name__}")


def error(result: object) -> DoqError:
    """`result`, which must be the machine's error (returned, not raised)."""
    if isinstance(result, DoqError):
        return result
    raise TypeError(f"expected a DoqError, the result is {type(result).__name__}")


def none(result: object) -> None:
    """A command that answers nothing (DeleteQueue, Nack...): raises its error, if any."""
    if result is not None:
        expect(result, type(None))


def count(result: object) -> int:
    """`PurgeQueue`, `Touch`: an int."""
    return expect(result, int)


def messages(result: object) -> list[MessageView]:
    """`Dequeue`: the messages it leased or removed."""
    return cast(list[MessageView], expect(result, list))


def item_results(result: object) -> ItemResults:
    """`Enqueue`: one result per item."""
    return cast(ItemResults, expect(result, list))


def ack_results(result: object) -> AckResults:
    """`Ack`: None or an error per id."""
    return cast(AckResults, expect(result, list))


def columns_result(result: object) -> EnqueueColumnsResult:
    """`EnqueueColumns`: the result column by column."""
    return expect(result, EnqueueColumnsResult)


def fresh(results: ItemResults) -> int:
    """How many items were newly enqueued (not duplicates, not failed)."""
    return sum(1 for r in results if type(r) is EnqueueResult and not r.duplicate)


def fresh_columns(res: EnqueueColumnsResult) -> int:
    return len(res.ids) - len(res.duplicates) - len(res.errors)
