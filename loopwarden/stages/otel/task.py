"""The bridge's work on one owned partition of ``otlp_spans``, without Kafka.

Shaped like :class:`loopwarden.stages.health.task.PartitionTask`, so the engine runs it as a
stage: :meth:`BridgeTask.rebuild` from the committed store (trace id -> encoded
:class:`~loopwarden.stages.otel.fold.TraceState`), :meth:`BridgeTask.fold` a batch into a
:class:`Folded` — the events to publish on ``agent.steps`` (keyed by run id, default
partitioner), dead letters, one changelog record per trace touched, the consumed offsets,
counts for metrics — that the engine commits in one transaction, then
:meth:`BridgeTask.committed` (or :meth:`BridgeTask.discard` when the transaction failed).

Per-trace state is bounded (``Limits.max_spans_per_trace``) and dropped once a trace has
had no new span for ``Limits.trace_retention_s`` (at a punctuation, when caught up).

What the engine's adapter does with a :class:`Folded`, in one transaction: produce
``outputs`` (``partition`` None: the default murmur2 partitioner over ``agent.steps``, so a
run's events land where the worker expects them), produce ``deadletters`` to the dead-letter
topic with the worker's headers (reason, error, source topic, partition, offset): each stands for its
record with a content-free description of it (loopwarden.stages.otel.deadletter), never the message's bytes,
write ``changes`` to the stage's changelog (key = trace id in hex; None = tombstone), commit
``offsets``; after the commit apply ``changes`` to the store and call :meth:`BridgeTask.committed`.
Call ``fold([], punctuate=True, caught_up=...)`` often (the stage asks every ``PUNCTUATE_S``): a
run held for its end grace goes out at the first caught-up fold past its due time, and a fold with
nothing due costs one comparison; traces past retention are looked for at most every
``expire_every_ms``. ``counts`` keys: ``("invalid", "otlp_spans", reason)``, ``("otel", label)`` with label in
``spans``, ``span_refused``, ``span_duplicate``, ``span_late``, ``span_after_end``, ``span_trace_full``,
``runs_ended``, ``traces_expired``, ``runs_unended``, ``message_not_keyed_by_trace`` (the exporter
lacks ``partition_traces_by_id``), ``hook_attribute_bad``, ``runs_hook_refused``, ``hook_run_id_reused``,
``run_guessed_wrong``, and ``("otel_event", event type)``;
:attr:`BridgeTask.traces` is the number of traces held (a gauge).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from loopwarden.codecs.events import EventsDropped, RunEnded, RunStarted, StepFinished
from loopwarden.stages.otel.fold import (
    Limits,
    TraceState,
    close_due,
    decode_trace,
    encode_trace,
    expired,
    fold_trace,
    next_close,
    unended_runs,
)
from loopwarden.stages.otel.deadletter import describe
from loopwarden.stages.otel.spans import BadTraces, Refused, Span, decode_traces
from loopwarden.engine.stage import DeadLetter, Folded, Output, Record, TaskBase, header, wall_clock_ms

log = logging.getLogger("loopwarden.otel")


DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # the Collector's exporter sends at most 1 MB by default
DECODE_BLOCK = 64  # records decoded before they are folded
PUNCTUATE_S = 0.1  # how often the stage asks a task for what became due (a held run waits at most this more)
_NEVER = 1 << 62  # a due time no clock reaches
_encode_event = msgspec.json.Encoder().encode
_new_output = tuple.__new__
# the counts label of each event type the fold publishes
_EVENT_LABEL = {t: ("otel_event", t.__struct_config__.tag) for t in (RunStarted, StepFinished, RunEnded,
                                                                           EventsDropped)}
JSON_HEADERS = (("content-type", b"application/json"),)


@dataclass(frozen=True)
class _Placed:
    """A record reduced to its place: what a dead letter keeps when its description cannot be made."""

    topic: str
    partition: int
    offset: int
    key: None = None
    value: bytes = b""
    headers: tuple = ()


class BridgeTask(TaskBase):  # one input: nothing held back for another (TaskBase: no stream-time alignment)
    """One partition of ``otlp_spans``: its traces' committed states (``store``) and their last activity."""

    def __init__(self, partition: int, store: Mapping[bytes, bytes], *, steps_topic: str,
                 limits: Limits = Limits(), wall_ms: Callable[[], int] = wall_clock_ms,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_future_ms: int = 300_000,
                 expire_every_ms: int = 1000) -> None:
        self.partition = partition
        self.store = store
        self.steps_topic = steps_topic
        self.limits = limits
        self.wall_ms = wall_ms
        self.max_message_bytes = max_message_bytes
        # A span ending further ahead of this wall clock is refused, as the worker refuses such events:
        # its events would be dead-lettered there, leaving its run without them.
        self.max_future_ms = max_future_ms
        self.last_ms: dict[bytes, int] = {}  # trace id -> last activity (committed), for retention
        self.closing: dict[bytes, int] = {}  # trace id -> when its next run's end grace is over (committed)
        self.next_due = _NEVER  # the earliest of closing's times: a fold before it has nothing to publish
        self.expire_every_ms = expire_every_ms
        self._expire_at = 0  # the wall time from which a punctuation looks for expired traces again
        self._live: dict[bytes, TraceState | None] = {}
        self._warned_keys = False

    # -- recovery -------------------------------------------------------------------
    def rebuild(self) -> int:
        """The retention index from the committed store; returns the traces held."""
        self.last_ms.clear()
        self.closing.clear()
        for key, raw in self.store.items():
            state = decode_trace(raw)
            self.last_ms[key] = state.last_ms
            due = next_close(state)
            if due is not None:
                self.closing[key] = due
        self.next_due = min(self.closing.values(), default=_NEVER)
        return len(self.last_ms)

    def load(self, trace_id: bytes) -> TraceState | None:
        if trace_id in self._live:
            return self._live[trace_id]
        raw = self.store.get(trace_id)
        return None if raw is None else decode_trace(raw)

    # -- the batch ------------------------------------------------------------------------
    def fold(self, records: Iterable[Record], *, punctuate: bool = False, caught_up: bool = True,
             lagging: Collection[str] = ()) -> Folded:
        """Turn a batch of ``otlp_spans`` records (offset order) into events, state changes and offsets.

        When ``caught_up`` (the input consumed to its end), runs whose start or end grace has passed
        are published too (a call with no records does just that: the engine's punctuation); while a
        backlog drains they wait, since their late spans may be in it. ``punctuate`` (and caught up)
        also drops the traces past retention. ``lagging`` is accepted for the engine's sake and
        unused: the bridge has one input."""
        out = Folded()
        self._live.clear()
        now = self.wall_ms()
        # Decoded a block at a time, then folded: each loop keeps its own code and data warm (measured:
        # docs/opentelemetry.md, "Performance"), and a block bounds what is held decoded at once.
        decoded: list[tuple[Record, list[Span]]] = []
        for rec in records:
            out.consumed += 1
            out.offsets[rec.topic] = rec.offset + 1
            spans = self._decode(rec, now, out)
            if spans is not None:
                decoded.append((rec, spans))
                if len(decoded) >= DECODE_BLOCK:
                    self._fold_decoded(decoded, now, out)
                    decoded.clear()
        if decoded:
            self._fold_decoded(decoded, now, out)
        if caught_up and self.next_due <= now:  # runs in their start or end grace: due ones go out
            for key, due in list(self.closing.items()):
                if due <= now:
                    state = self.load(key)
                    if state is not None:
                        self._live[key] = state
                        self._emit(close_due(state, key.decode(), now, self.limits), out)
        if punctuate and caught_up and now >= self._expire_at:
            self._expire_at = now + self.expire_every_ms
            self._expire(now, out)
        for key, state in self._live.items():
            out.changes[key] = None if state is None else encode_trace(state)
        return out

    def _decode(self, rec: Record, now: int, out: Folded) -> list[Span] | None:
        """A record's spans; None when none is left to fold. A message that is not TracesData is dead-lettered;
        a span that cannot be trusted (a bad id, time or mapped attribute; an end further ahead of this clock
        than ``max_future_ms``) costs itself: its placeholder tells its run of the loss (``Span.lost``), and the
        message is dead-lettered too, so the operator sees what was refused and why."""
        value = rec.value if rec.value is not None else b""
        refused: list[Refused] = []
        try:
            if len(value) > self.max_message_bytes:
                raise BadTraces("oversized", f"message of {len(value)} bytes is over max_message_bytes="
                                             f"{self.max_message_bytes}")
            spans = decode_traces(value, header(rec.headers, "content-type") if rec.headers else None, refused)
            if not spans and not refused:
                raise BadTraces("not_traces_data", "no spans in the message")
            if spans:
                latest = max([s.end_ns for s in spans]) // 1_000_000
                if latest > now + self.max_future_ms:
                    spans = self._refuse_future(spans, now, refused)
        except BadTraces as exc:
            self._dead(rec, exc.reason, str(exc), refused, out)
            return None
        except Exception as exc:  # a bug of ours must not stop the partition nor lose the message
            log.exception("internal error on %s[%d]@%d; dead-lettered", rec.topic, rec.partition, rec.offset)
            self._dead(rec, "internal_error", f"{type(exc).__name__}: {exc}", [], out)
            return None
        if refused:
            out.counts["otel", "span_refused"] += len(refused)
            first = refused[0]
            self._dead(rec, first.reason, f"{len(refused)} span(s) refused, the rest folded; the first: {first.error}",
                       refused, out)
        return spans or None

    def _refuse_future(self, spans: list[Span], now: int, refused: list[Refused]) -> list[Span]:
        """``spans`` with each one ending too far ahead of this clock refused: the worker would refuse its
        events, so it becomes a placeholder ending now (a host whose clock is ahead costs its spans only)."""
        limit_ns = (now + self.max_future_ms) * 1_000_000
        now_ns = now * 1_000_000
        kept = []
        for s in spans:
            if s.end_ns > limit_ns:
                if not s.lost:  # (a placeholder ahead is already refused: its times are moved back only)
                    ahead = (s.end_ns // 1_000_000 - now) / 1000
                    refused.append(Refused(s.trace_id, s.span_id, s.parent_id, "ts_in_future",
                                           f"span {s.span_id} of trace {s.trace_id} ends {ahead:.0f} s ahead of "
                                           f"this bridge's clock (at most {self.max_future_ms / 1000:g} s)"))
                s = msgspec.structs.replace(s, start_ns=min(s.start_ns, now_ns), end_ns=now_ns,
                                            lost=s.lost or "ts_in_future")
            kept.append(s)
        return kept

    def _dead(self, rec: Record, reason: str, error: str, refused: list[Refused], out: Folded) -> None:
        """Dead-letter ``rec`` as its content-free description (its bytes hold the runtime's content)."""
        try:
            stand_in = describe(rec, reason, error, refused)
        except Exception:  # describing must not lose the message either: its place and the error suffice
            log.exception("cannot describe %s[%d]@%d", rec.topic, rec.partition, rec.offset)
            stand_in = describe(_Placed(rec.topic, rec.partition, rec.offset), reason, error)
        out.deadletters.append(DeadLetter(stand_in, reason, error))
        out.counts["invalid", "otlp_spans", reason] += 1
        log.warning("dead-lettered %s[%d]@%d (%s): %s", rec.topic, rec.partition, rec.offset, reason, error)

    def _fold_decoded(self, decoded: list[tuple[Record, list[Span]]], now: int, out: Folded) -> None:
        """Fold decoded messages, in offset order, into their traces' states."""
        for rec, spans in decoded:
            first = spans[0].trace_id
            if all([s.trace_id == first for s in spans]):  # the exporter's partition_traces_by_id: one trace
                by_trace: dict[str, list[Span]] = {first: spans}
            else:
                by_trace = {}
                for span in spans:
                    by_trace.setdefault(span.trace_id, []).append(span)
            if len(by_trace) > 1 or rec.key is None or rec.key.decode("ascii", "replace") not in by_trace:
                # Not one trace keyed by its id: without the exporter's partition_traces_by_id a trace's
                # spans spread over partitions, and each partition sees part of a run. Counted, warned once.
                out.counts["otel", "message_not_keyed_by_trace"] += 1
                if not self._warned_keys:
                    self._warned_keys = True
                    log.warning("%s[%d]@%d is not one trace keyed by its trace id: set the Collector's kafka "
                                "exporter partition_traces_by_id: true, or runs may be split across partitions",
                                rec.topic, rec.partition, rec.offset)
            for trace_id, group in by_trace.items():
                key = trace_id.encode()
                state, folded = fold_trace(self.load(key), trace_id, group, now, self.limits)
                self._live[key] = state
                self._emit(folded, out)

    def _emit(self, folded, out: Folded) -> None:
        counts = out.counts
        for label, n in folded.counts.items():
            counts["otel", label] += n
        events = folded.events
        if not events:
            return
        append, topic, encode, labels = out.outputs.append, self.steps_topic, _encode_event, _EVENT_LABEL
        for event in events:
            # Output(topic, key, value, headers, partition=None) without NamedTuple's Python-level __new__
            append(_new_output(Output, (topic, event.run_id.encode(), encode(event), JSON_HEADERS, None)))
            counts[labels[type(event)]] += 1

    def _expire(self, now: int, out: Folded) -> None:
        """Drop the traces with no new span for the retention period (runs still open go STUCK in the worker)."""
        limit_ms = self.limits.trace_retention_s * 1000
        for key, last in list(self.last_ms.items()):
            if key in self._live or now - last < limit_ms:
                continue
            state = self.load(key)
            if state is not None and expired(state, now, self.limits):
                out.counts["otel", "traces_expired"] += 1
                open_runs = unended_runs(state)
                if open_runs:
                    out.counts["otel", "runs_unended"] += open_runs
                self._live[key] = None

    # -- after the transaction ----------------------------------------------------------
    def committed(self, out: Folded) -> None:
        """The batch's transaction committed: its traces' activity becomes the retention index."""
        for key, state in self._live.items():
            due = None if state is None else next_close(state)
            if due is None:
                self.closing.pop(key, None)
            else:
                self.closing[key] = due
            if state is None:
                self.last_ms.pop(key, None)
            else:
                self.last_ms[key] = state.last_ms
        if self._live:
            self.next_due = min(self.closing.values(), default=_NEVER)
        self._live.clear()

    def discard(self) -> None:
        """The batch's transaction failed: the store still holds the committed states."""
        self._live.clear()

    @property
    def traces(self) -> int:
        return len(self.last_ms)
