"""Committed run state per owned partition: in memory or in RocksDB, restored from the changelog.

The changelog topic (``<app id>-runs-changelog``, compacted, partitioned like the
inputs) is the source of truth: each transaction writes one record per run touched
(its encoded state; a tombstone when retention dropped it). A store only ever holds
committed state: the loop writes a batch's changes after its transaction committed.

Recovery of a partition = read its changelog partition ``read_committed`` from the
store's position to the end. The memory store starts from offset 0 every time; the
RocksDB store keeps, in the same atomic write as the states, the changelog offset it
holds everything before, so a restart reads only the tail. A RocksDB position past
the changelog's end (the topics were deleted and made anew while the volume was
kept) wipes that partition's local state and restores it from offset 0.

The engine's own changelog record (``OFFSETS_KEY``: the input offsets a transaction consumed up
to) is not a stage's state: a store keeps its last value as ``offsets``, beside its position,
and never shows it to the fold.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from loopwarden.engine.exceptions import ConfigError

log = logging.getLogger("loopwarden.store")

_POSITION_KEY = b"\xffloopwarden/changelog-position"
# The changelog record of the engine's own (not a stage's): the input offsets its transaction consumed up to
# (loopwarden.engine.checkpoint). A store keeps it beside its position, out of the stage's view.
OFFSETS_KEY = b"\xffloopwarden/engine/input-offsets"
_HIDDEN = (_POSITION_KEY, OFFSETS_KEY)


class PartitionStore(Mapping[bytes, bytes]):
    """One partition's committed states (key -> encoded state); read-only to the fold."""

    position: int = 0  # the changelog offset everything before which this store holds
    offsets: bytes | None = None  # the last OFFSETS_KEY record's value before ``position`` (None: none seen)

    def write(self, changes: Mapping[bytes, bytes | None], position: int | None, offsets: bytes | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def wipe(self) -> None:
        raise NotImplementedError


class MemoryPartition(PartitionStore):
    """A dict of bytes: about the encoded state's size per run plus ~150 B of dict and object overhead."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self.position = 0
        self.offsets = None

    def __getitem__(self, key: bytes) -> bytes:
        return self._data[key]

    def get(self, key, default=None):
        return self._data.get(key, default)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def items(self):
        return self._data.items()

    def write(self, changes: Mapping[bytes, bytes | None], position: int | None, offsets: bytes | None = None) -> None:
        data = self._data
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if position is not None:
            self.position = position
        if offsets is not None:
            self.offsets = offsets

    def wipe(self) -> None:
        self._data.clear()
        self.position = 0
        self.offsets = None


class RocksPartition(PartitionStore):
    """A RocksDB database per partition (rocksdict); states and changelog position written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open()
        raw = self._db.get(_POSITION_KEY)
        self.position = int(raw.decode()) if raw is not None else 0
        self.offsets = self._db.get(OFFSETS_KEY)

    def _open(self):
        from rocksdict import Options, Rdict

        return Rdict(str(self.path), options=Options(raw_mode=True))

    def __getitem__(self, key: bytes) -> bytes:
        value = self._db.get(key)
        if value is None or key in _HIDDEN:
            raise KeyError(key)
        return value

    def get(self, key, default=None):
        value = self._db.get(key)
        return default if value is None or key in _HIDDEN else value

    def __iter__(self) -> Iterator[bytes]:
        for key in self._db.keys():
            if key not in _HIDDEN:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def items(self):
        return ((k, v) for k, v in self._db.items() if k not in _HIDDEN)

    def write(self, changes: Mapping[bytes, bytes | None], position: int | None, offsets: bytes | None = None) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        if position is not None:
            wb.put(_POSITION_KEY, str(position).encode())
            self.position = position
        if offsets is not None:
            wb.put(OFFSETS_KEY, offsets)
            self.offsets = offsets
        self._db.write(wb)

    def close(self) -> None:
        self._db.close()

    def wipe(self) -> None:
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self.position = 0
        self.offsets = None


def prepare_data_dir(data_dir: str) -> Path:
    """The RocksDB directory, created if missing; its parent must exist (a mistyped path is an error, not a new tree).

    Raises ConfigError naming the path and why it cannot be used."""
    path = Path(data_dir).expanduser()
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"data_dir: {data_dir!r}: its parent {str(parent)!r} does not exist or is not a directory "
                          f"(create it first)")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"data_dir: {data_dir!r} is not a directory")
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"data_dir: {data_dir!r} cannot be created: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"data_dir: {data_dir!r} is not writable by this user")
    return path


def open_partition(kind: str, data_dir: str, app_id: str, partition: int, name: str = "runs") -> PartitionStore:
    """A partition's store: in memory, or RocksDB at ``<data_dir>/<app_id>/<name>-<partition>``."""
    if kind == "memory":
        return MemoryPartition()
    return RocksPartition(Path(data_dir) / app_id / f"{name}-{partition}")
