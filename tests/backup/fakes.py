"""An in-memory stand-in for StateStore's backup contract (versions, tombstones)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from doq.backup.format import Record
from doq.errors import FailedPrecondition, InvalidArgument
from doq.storage.digest import digest_of


class FakeState:
    """key -> (value or None for a tombstone, version); `applied_index` like the store."""

    def __init__(self, horizon: int = 0) -> None:
        self.records: dict[bytes, tuple[bytes | None, int]] = {}
        self.applied_index = 0
        self.horizon = horizon
        self.cluster_id = ""

    def apply(self, index: int, puts: dict[bytes, bytes | None]) -> None:
        """One log entry: writes (value None = delete, leaving a tombstone)."""
        assert index > self.applied_index
        for k, v in puts.items():
            self.records[k] = (v, index)
        self.applied_index = index

    def changes(self, since: int) -> tuple[int, Iterator[Record]]:
        if since < 0:
            raise InvalidArgument("since must be >= 0", reason="INVALID_SINCE")
        if 0 < since < self.horizon:
            raise InvalidArgument("since too old", reason="SINCE_TOO_OLD")
        rows = sorted((ver, k, v) for k, (v, ver) in self.records.items() if ver >= since)
        return self.applied_index, ((k, v, ver) for ver, k, v in rows)

    def snapshot_changes(self, since: int) -> tuple[int, int, Iterator[Record]]:
        applied, it = self.changes(since)
        return applied, digest_of((k, v, ver) for k, (v, ver) in self.records.items()), it

    def iter_changes(self, since: int) -> Iterator[Record]:
        return self.changes(since)[1]

    def is_empty(self) -> bool:
        return self.applied_index == 0 and not self.records

    def restore(self, records: Iterable[Record], applied_index: int, cluster_id: str = "") -> int:
        """All or nothing, as StateStore.restore: built aside, swapped in at the end."""
        if not self.is_empty():
            raise FailedPrecondition("not empty", reason="RESTORE_TARGET_NOT_EMPTY")
        fresh: dict[bytes, tuple[bytes | None, int]] = {}
        for k, v, ver in records:
            fresh[k] = (v, ver)
        self.records = fresh
        self.applied_index = applied_index
        self.cluster_id = cluster_id or self.cluster_id
        return len(fresh)

    def live(self) -> dict[bytes, bytes]:
        return {k: v for k, (v, _) in self.records.items() if v is not None}
