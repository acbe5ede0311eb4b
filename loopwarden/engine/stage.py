"""What a stage is: the contract between the engine (``loopwarden.engine.loop``) and one stateful step.

A **stage** declares what it reads and writes and makes a :class:`Task` per owned
partition; the engine does the rest (polling, the per-partition runtime, one Kafka
transaction per batch with outputs + changelog + offsets, recovery from the changelog,
fencing, rebalances, stream-time alignment, lag and stall watch, the loop's metrics).

A stage declares:

- ``inputs``: its input topics, co-partitioned (partition *i* of each goes to the same
  task), each with a role. ``tracked`` inputs are the data: they count for lag, progress
  and stream-time alignment; an untracked one (the health stage's ticks) does not.
- ``outputs``: the topics it produces to. An :class:`Output` may go to ANY topic with ANY
  key: ``partition=None`` picks the default (murmur2) partitioner over that topic's
  partitions, as every Kafka client does; topics listed in ``keyed_like_input`` are keyed
  like the input (the same key ⇒ partition *i* when their partition count is the inputs'),
  which spares hashing every key again.
- ``changelog_topic``: compacted, co-partitioned with the inputs; the task's store is
  restored from it. The state codec is the task's own (the store holds bytes).
- ``deadletter_topic``: where a :class:`DeadLetter` a fold returns goes (the original
  message, headers naming the error).
- ``punctuate_every_s``: how often the engine asks each task to fire its due timers.

A **task** folds one partition's records. It is pure apart from its store (a read-only
``Mapping[bytes, bytes]`` of committed state) and what it keeps between :meth:`Task.fold`
and :meth:`Task.committed` / :meth:`Task.discard`. The engine calls, per partition::

    task = stage.task(partition, store)   # after the store was restored from the changelog
    for _ in task.rebuild_steps(): …      # timers etc. from the committed store, a step at a time (below)
    loop:
        result = task.fold(records, punctuate=…, caught_up=…, lagging=…)
        commit result.outputs + dead letters + result.changes + result.offsets in one transaction
        task.committed(result)   |   task.discard()   (the transaction failed: its batch comes again)

``fold``'s keywords: ``punctuate`` — fire due timers; ``caught_up`` — the tracked inputs
are consumed to their end (a task may hold timers back while a backlog drains);
``lagging`` — roles of tracked inputs that hold more than has been consumed: a task that
aligns its inputs in stream time may hold records stamped later than a lagging input's
stream time (it reports how many in ``holding``, and of which topics in ``held_topics``; once the
input it waits for has sent no backlog for ``align_max_ms``, the engine folds it again with no
``lagging``, as Kafka Streams' ``max.task.idle.ms``; while it holds ``alignment.HOLD_MAX``, the topics
it holds are not fetched). A task that does not align ignores ``lagging`` and keeps
``holding = held_bytes = 0``, ``held_topics = ()``. What waits in memory, records buffered and held,
is bounded by ``input_buffer_max_bytes`` (the engine's :meth:`Engine.process`).

The engine calls a task only through this contract, never guessing at an attribute. Its two hooks
besides the fold: **timers** are ``fold(punctuate=True)``, once per ``punctuate_every_s`` and only with
a batch, so what they change commits with it (Kafka Streams' punctuator, Bytewax's ``on_notify``);
the **pre-fold hold** is :attr:`Task.settling` (a :class:`Settles`, or None), which the engine reads
before every fold.

:class:`TaskBase` gives a task the parts it may leave out: no alignment, nothing to rebuild
beyond the store, ``rebuild_steps()`` as one step, nothing kept between fold and commit.
A task shaped like that (the health stage's ``PartitionTask``, the OpenTelemetry
bridge's task) plugs in with a few lines: see ``tests/engine/counter_stage.py`` and
``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar


class Record(Protocol):
    """What a consumed Kafka record offers (aiokafka's ConsumerRecord has these)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: object


def wall_clock_ms() -> int:
    """The wall clock in ms since the epoch, as Kafka stamps records."""
    return int(time.time() * 1000)


def value_bytes(records) -> int:
    """The bytes of ``records``' values (a tombstone's: 0): what ``input_buffer_max_bytes`` counts."""
    return sum(len(rec.value) for rec in records if rec.value is not None)


def header(headers, name: str) -> str | None:
    """A header's value as text (aiokafka gives a sequence of (str, bytes) pairs)."""
    for key, value in headers or ():
        if key.lower() == name:
            return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return None


class Output(NamedTuple):
    """One record a fold produces: ``partition=None`` — the default partitioner over ``topic``'s partitions."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None


@dataclass
class DeadLetter:
    """An input record a fold could not use: sent unchanged to the stage's dead-letter topic."""

    record: Any  # the consumed record (topic, partition, offset, key, value, headers)
    reason: str
    error: str


@dataclass(frozen=True)
class Input:
    """An input topic of a stage, and its role (the name the task knows it by)."""

    topic: str
    role: str
    tracked: bool = True  # counts for lag, progress and alignment (a control topic like ticks does not)


@dataclass
class Folded:
    """What a fold returns, the one name of a fold's result in every stage: committed in one transaction, in
    this order (outputs, dead letters, changes, offsets). A stage whose observers need more of a batch
    extends it (the health stage's ``HealthFolded`` adds the batch's transitions)."""

    outputs: list[Output] = field(default_factory=list)
    deadletters: list[DeadLetter] = field(default_factory=list)
    changes: dict[bytes, bytes | None] = field(default_factory=dict)  # store key -> new value, None deletes
    offsets: dict[str, int] = field(default_factory=dict)  # input topic -> next offset to consume
    # Bounded-label counts for the stage's metrics, aggregated over the batch: (kind, label, ...) -> n
    counts: Counter = field(default_factory=Counter)
    consumed: int = 0  # input records

    def __bool__(self) -> bool:  # anything to commit
        return bool(self.outputs or self.deadletters or self.changes or self.offsets)


@dataclass(frozen=True)
class Horizon:
    """How far old partitions' records were forwarded after an expansion, as read at ``read_ms`` (wall clock).

    ``first``: old partition -> the smallest timestamp of a record on it not consumed (so not
    forwarded) yet, None when everything on it was consumed. ``need``: input topic -> the
    offset of the new partition the task must have consumed to hold every record forwarded
    before the reading."""

    read_ms: int
    first: dict[int, int | None]
    need: dict[str, int]


class Settles(Protocol):
    """A task's pre-fold hold after an expansion (the health stage's ``Settling``): the old partitions it waits
    for, and the :class:`Horizon` s the engine reads for them before a fold (``loopwarden.engine.horizons``)."""

    needed: set[int]  # old partitions the records it holds wait for (empty: nothing to read)
    pending: Horizon | None  # read, waiting for the consumer to reach its ``need``
    horizon: Horizon | None  # the last one whose forwarded records the task holds


class Task(Protocol):
    """One owned partition's fold (see the module docstring for the call order)."""

    # The pre-fold hold: a task that holds records of moved runs after an expansion until their old partitions'
    # records are forwarded; the engine reads a Horizon for it before each fold. None: the task holds nothing.
    settling: Settles | None

    @property
    def holding(self) -> int: ...  # records held back for a lagging input (0 if the task does not align)
    @property
    def held_bytes(self) -> int: ...  # their values' bytes (stage.value_bytes; 0 if the task does not align)

    @property
    def held_topics(self) -> Iterable[str]: ...  # the input topics of those records (none if the task does not align)

    # From the restored store, before the partition is handed batches: ``rebuild_steps()`` does ``rebuild()``'s work
    # a step at a time, and the engine serves the worker's other partitions between steps (a partition owned again
    # after a failure: loopwarden.engine.reowning). TaskBase's is one step.
    def rebuild(self) -> object: ...
    def rebuild_steps(self) -> Iterator[object]: ...
    def fold(self, records: Iterable[Any], *, punctuate: bool, caught_up: bool,
             lagging: Iterable[str]) -> Folded: ...
    def committed(self, result: Folded) -> object: ...
    def discard(self) -> None: ...


TaskT = TypeVar("TaskT", bound=Task)  # the stage's own task: its observers get it typed, as it made it
ResultT = TypeVar("ResultT", bound=Folded)  # what the stage's fold returns


class LayoutVerdict(Protocol):
    """What a layout reading says: whether the engine may fold (``ok``) and produce, and why not."""

    @property
    def ok(self) -> bool: ...
    produce: bool

    def reason(self) -> str: ...


class LayoutWatch(Protocol):
    """What re-reads a stage's topic layout while it runs (the health stage's ``TopologyWatch``); the engine's
    layout guard pauses or holds partitions as its verdict says (``loopwarden.engine.layoutguard``)."""

    expected_outputs: dict[str, int]  # output topic -> the partition count it must keep

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def check(self) -> tuple[LayoutVerdict, bool]: ...  # the verdict, and whether the layout changed
    def hold_to(self, group: Mapping[str, int]) -> None: ...  # the group's output counts, at an assignment
    async def auto_create_enabled(self) -> bool | None: ...


class Stage(Protocol[TaskT, ResultT]):
    """A stateful stage the engine runs (see the module docstring)."""

    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    keyed_like_input: frozenset[str]
    changelog_topic: str
    deadletter_topic: str
    store_name: str  # local store directory prefix (RocksDB): <data_dir>/<app_id>/<store_name>-<partition>
    punctuate_every_s: float

    async def prepare(self) -> None:
        """Before the engine joins the group: create or check the topics."""

    def layout_watch(self) -> LayoutWatch | None:
        """What re-reads the stage's topic layout while it runs, or None (not watched)."""

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> TaskT: ...

    # Observers (metrics, read indexes): called after the fact, never inside a transaction, with the partition's
    # number and the stage's own task (``summary``: what the task's ``committed`` returned).
    def restored(self, partition: int, task: TaskT) -> None: ...
    def committed(self, partition: int, task: TaskT, result: ResultT, summary: object) -> None: ...
    def aborted(self, partition: int, task: TaskT, result: ResultT) -> None: ...
    def dropped(self, partition: int, task: TaskT) -> None: ...
    def summary(self, tasks: list[TaskT]) -> str: ...  # appended to the "partitions … recovered" log line


class TaskBase:
    """Defaults for a task's optional parts: it does not align its inputs (nothing held), has nothing to rebuild
    beyond its store (in one step), and keeps nothing between fold and commit."""

    holding = held_bytes = 0
    held_topics: tuple[str, ...] = ()
    settling: Settles | None = None

    def rebuild(self) -> object:
        return None

    def rebuild_steps(self) -> Iterator[object]:
        yield self.rebuild()

    def committed(self, result: Folded) -> object:
        return None

    def discard(self) -> None:
        return None


class StageBase(Generic[TaskT, ResultT]):
    """Defaults for a stage's optional parts: no keyed-like-input outputs, observers that do nothing.
    ``StageBase[MyTask, MyResult]``: the observers get the stage's own task and fold result, typed."""

    keyed_like_input: frozenset[str] = frozenset()
    punctuate_every_s: float = 1.0
    store_name: str = "state"

    async def prepare(self) -> None:
        return None

    def layout_watch(self) -> LayoutWatch | None:
        """What re-reads the stage's topic layout while it runs, or None (not watched)."""
        return None

    def restored(self, partition: int, task: TaskT) -> None:
        return None

    def committed(self, partition: int, task: TaskT, result: ResultT, summary: object) -> None:
        return None

    def aborted(self, partition: int, task: TaskT, result: ResultT) -> None:
        return None

    def dropped(self, partition: int, task: TaskT) -> None:
        return None

    def summary(self, tasks: list[TaskT]) -> str:
        return ""
