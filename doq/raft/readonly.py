"""Bookkeeping of ReadIndex requests waiting for a heartbeat quorum (leader side)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ReadStatus:
    index: int
    context: bytes
    frm: str
    acks: set[str] = field(default_factory=set)


class ReadOnly:
    """Pending reads in arrival order, keyed by their (unique) context."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[bytes, ReadStatus] = {}

    def add_request(self, index: int, context: bytes, frm: str) -> bool:
        if context in self._pending:
            return False
        self._pending[context] = ReadStatus(index, context, frm)
        return True

    def recv_ack(self, frm: str, context: bytes) -> set[str] | None:
        rs = self._pending.get(context)
        if rs is None:
            return None
        rs.acks.add(frm)
        return rs.acks

    def advance(self, context: bytes) -> list[ReadStatus]:
        """Pop and return every request up to and including ``context``: a quorum
        acknowledging a later heartbeat confirms leadership for earlier ones too."""
        if context not in self._pending:
            return []
        done: list[ReadStatus] = []
        for ctx in list(self._pending):
            done.append(self._pending.pop(ctx))
            if ctx == context:
                break
        return done

    def last_pending_context(self) -> bytes:
        return next(reversed(self._pending)) if self._pending else b""

    def reset(self) -> None:
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._pending)
