/**
 * A bounded, non-blocking queue in front of a sink.
 *
 * `enqueue` never waits and never throws: the agent's loop must not slow down or fail because
 * Kafka does. Records are sent in order, in batches, by one background pump; a failed batch is
 * retried with exponential backoff.
 *
 * **Loss is never silent.** When the queue is full (Kafka down or slower than the fleet for longer
 * than the queue lasts), a record is dropped, counted in `stats().dropped`, counted per run, and
 * logged (rate-limited, naming the run and its count). Which record goes is the queue policy:
 * 1. the new record, when nothing queued ranks below it;
 * 2. else the newest queued record of the lowest rank below the new one, and the new one is queued.
 * Ranks (low to high): `run_active` (liveness only); every other event; `run_ended` and the loss
 * reports. So a run's `run_ended` is the last thing dropped: only when the queue holds nothing but
 * `run_ended` and loss reports. Once the queue has room again (after a batch was delivered, and
 * at close or process exit), every run that lost events gets one `events_dropped` with the count
 * (the `lossReport` option builds it): loopwarden then calls the run UNCERTAIN (`producer_dropped`)
 * instead of blaming the agent for the gap or the silence. What is left at close is counted as
 * dropped and logged with the runs it belonged to.
 *
 * **Process exit without `close()`.** When the event loop empties while records are still queued
 * (Node's `beforeExit`), the publisher closes itself with a budget of `exitFlushMs` (default
 * 2 000 ms): what can be delivered in that time is, the rest is counted and logged, the sink is
 * closed, and the process exits.
 */
import { RateLimitedLog, type Sink, type SinkLogger, type SinkRecord } from './sinks.js';
import { settleWithin } from './timing.js';

/** Ranks of the queue policy: the lowest is dropped first. */
export const PRIORITY = { liveness: 0, normal: 1, end: 2 } as const;

export interface PublisherOptions {
  /** Records held while the sink is slow or down (default 10 000). */
  maxQueue?: number;
  /** Records per `send` (default 500). */
  maxBatch?: number;
  /** First retry delay after a failed send, doubled up to `maxBackoffMs` (defaults 100, 5 000). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** Told about sink failures (never required; errors are also counted). */
  onSinkError?: (error: unknown) => void;
  /**
   * The record that reports `count` lost events of the run keyed `key` (the client builds an
   * `events_dropped`); without it losses are counted and logged only.
   */
  lossReport?: (key: string, count: number) => SinkRecord | null | undefined;
  /** Where loss lines go (default `console`); at most `lossLogBurst` (5) lines a minute. */
  logger?: SinkLogger;
  lossLogBurst?: number;
  /** Budget of the flush when the process is about to exit without `close()` (default 2 000 ms). */
  exitFlushMs?: number;
  /**
   * A `send` that has not settled after this long (default 30 000 ms) counts as failed: the sink is
   * reset (`Sink.reset`) and the batch retried. Timed with an unref'd timer.
   */
  sendTimeoutMs?: number;
}

export interface PublisherStats {
  /** records accepted into the queue */
  enqueued: number;
  /** records the sink acknowledged */
  published: number;
  /** events lost: refused or evicted when the queue was full, or not delivered by close / exit */
  dropped: number;
  /** failed `send` attempts */
  sinkErrors: number;
  /** records waiting now (queued plus in flight; 0 after close) */
  pending: number;
}

interface Entry {
  record: SinkRecord;
  priority: number;
  /** > 0: a loss report for this many events (not itself an event of the run) */
  reports: number;
}

export class Publisher {
  private readonly queue: Entry[] = [];
  private inFlight: readonly Entry[] = [];
  /** queued entries per priority (in flight excluded): finding a victim is then O(1) when there is none */
  private readonly ranked = [0, 0, 0];
  private pumping = false;
  private closed = false;
  /** 'abandon' once close() gave up on a sink that stays down */
  private closing: 'no' | 'flushing' | 'abandon' = 'no';
  private backoffMs = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private wakeRetry: (() => void) | undefined;
  private idleWaiters: Array<() => void> = [];
  private readonly counts = { enqueued: 0, published: 0, dropped: 0, sinkErrors: 0 };
  /** lost events per run key, not yet reported */
  private readonly lost = new Map<string, number>();
  /** a run's queued (not yet in flight) run_ended, by run key */
  private readonly queuedEnds = new Map<string, Entry>();
  private readonly log: RateLimitedLog;
  private readonly maxQueue: number;
  private readonly maxBatch: number;
  private readonly initialBackoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly exitFlushMs: number;
  private readonly sendTimeoutMs: number;

  constructor(
    private readonly sink: Sink,
    private readonly options: PublisherOptions = {},
  ) {
    this.maxQueue = Math.max(1, options.maxQueue ?? 10_000);
    this.maxBatch = Math.max(1, options.maxBatch ?? 500);
    this.initialBackoffMs = Math.max(1, options.initialBackoffMs ?? 100);
    this.maxBackoffMs = Math.max(this.initialBackoffMs, options.maxBackoffMs ?? 5_000);
    this.exitFlushMs = Math.max(0, options.exitFlushMs ?? 2_000);
    this.sendTimeoutMs = Math.max(1, options.sendTimeoutMs ?? 30_000);
    this.log = new RateLimitedLog(options.logger ?? console, options.lossLogBurst ?? 5, 60_000, Date.now, 'loss line');
    watchExit(this);
  }

  /**
   * Queue one record; false when it was dropped (queue full and nothing of a lower rank queued,
   * or the publisher closed). `priority`: see PRIORITY (default normal).
   */
  enqueue(record: SinkRecord, priority: number = PRIORITY.normal): boolean {
    const rank = priority === PRIORITY.liveness || priority === PRIORITY.end ? priority : PRIORITY.normal;
    if (this.closed) {
      this.lose({ record, priority: rank, reports: 0 }, 'publisher closed');
      return false;
    }
    // A run's end (run_ended) goes right after the report of what the run lost, so loopwarden's
    // verdict at the end already knows of the loss.
    return this.admit({ record, priority: rank, reports: 0 }, rank === PRIORITY.end);
  }

  stats(): PublisherStats {
    const pending = this.closing === 'abandon' ? 0 : this.queue.length + this.inFlight.length;
    return { ...this.counts, pending };
  }

  private push(entry: Entry): void {
    this.queue.push(entry);
    this.rank(entry.priority, 1);
    if (entry.priority === PRIORITY.end && entry.reports === 0) this.queuedEnds.set(entry.record.key, entry);
    this.counts.enqueued += 1;
    if (!this.pumping) {
      this.pumping = true;
      // Start on a later tick: the caller (an SDK callback) returns first.
      setImmediate(() => void this.pump());
    }
  }

  private rank(priority: number, delta: number): void {
    this.ranked[priority] = (this.ranked[priority] ?? 0) + delta;
  }

  private full(): boolean {
    return this.queue.length + this.inFlight.length >= this.maxQueue;
  }

  /**
   * Queue the entry, evicting the newest queued entry of the lowest rank below it if full.
   * `reportFirst`: queue the report of the entry's run's losses (if any) right before it.
   */
  private admit(entry: Entry, reportFirst = false): boolean {
    if (reportFirst && this.lost.has(entry.record.key)) {
      const key = entry.record.key;
      // Room for the report and the entry first, so that no eviction after the report is built
      // can be one of this run's events.
      this.makeRoom(entry.priority, 2);
      const count = this.lost.get(key);
      const build = this.options.lossReport;
      if (count !== undefined && build) {
        const report = safely(() => build(key, count));
        if (report) {
          this.lost.delete(key);
          this.admit({ record: report, priority: PRIORITY.end, reports: count });
        }
      }
    }
    if (!this.full()) {
      this.push(entry);
      return true;
    }
    let rank = -1;
    for (let p = 0; p < entry.priority; p += 1) {
      if ((this.ranked[p] ?? 0) > 0) {
        rank = p;
        break;
      }
    }
    if (rank < 0) {
      this.lose(entry, 'queue full');
      return false;
    }
    for (let i = this.queue.length - 1; i >= 0; i -= 1) {
      if (this.queue[i]?.priority === rank) {
        const victim = this.queue.splice(i, 1)[0]!;
        this.rank(rank, -1);
        this.lose(victim, 'queue full');
        break;
      }
    }
    this.push(entry);
    return true;
  }

  /** Evict entries ranked below `priority` (lowest rank, newest first) until `slots` are free or none is left. */
  private makeRoom(priority: number, slots: number): void {
    for (let p = 0; p < priority; p += 1) {
      for (let i = this.queue.length - 1; i >= 0; i -= 1) {
        if (this.queue.length + this.inFlight.length + slots <= this.maxQueue || (this.ranked[p] ?? 0) === 0) break;
        if (this.queue[i]?.priority === p) {
          const victim = this.queue.splice(i, 1)[0]!;
          this.rank(p, -1);
          this.lose(victim, 'queue full');
        }
      }
    }
  }

  /** Count a lost entry against its run (a lost loss report goes back to be reported again). */
  private lose(entry: Entry, why: string): void {
    const key = entry.record.key;
    if (this.closing === 'abandon' || (this.closed && this.closing === 'no')) {
      // after close: nothing can report it any more; counted and logged
      this.counts.dropped += entry.reports === 0 ? 1 : 0;
      this.log.write('warn', `loopwarden: ${why}: dropped an event of run ${JSON.stringify(key)} (${this.counts.dropped} in all)`);
      return;
    }
    if (entry.reports > 0) {
      this.lost.set(key, (this.lost.get(key) ?? 0) + entry.reports);
      return;
    }
    this.counts.dropped += 1;
    if (this.reportBeforeEnd(key)) return;
    const count = (this.lost.get(key) ?? 0) + 1;
    this.lost.set(key, count);
    this.log.write(
      'warn',
      `loopwarden: ${why} (${this.maxQueue} records): dropped an event of run ${JSON.stringify(key)} ` +
        `(${count} of this run not yet reported, ${this.counts.dropped} in all); ` +
        (this.options.lossReport ? 'an events_dropped event will report them' : 'they are counted in stats().dropped'),
    );
  }

  /**
   * The run's run_ended is queued already (an older event of the run was evicted after it): put
   * the report of this loss right before it (one report per run there, its count raised), so the
   * verdict taken at the run_ended knows of it. The report may take the queue one past maxQueue:
   * one per run whose end is queued, at most.
   */
  private reportBeforeEnd(key: string): boolean {
    const end = this.queuedEnds.get(key);
    const build = this.options.lossReport;
    if (end === undefined || build === undefined) return false;
    const at = this.queue.lastIndexOf(end);
    if (at < 0) return false;
    const before = this.queue[at - 1];
    const count = before !== undefined && before.reports > 0 && before.record.key === key ? before.reports + 1 : 1;
    const record = safely(() => build(key, count));
    if (!record) return false;
    if (count > 1) {
      before!.record = record;
      before!.reports = count;
    } else {
      this.queue.splice(at, 0, { record, priority: PRIORITY.end, reports: 1 });
      this.rank(PRIORITY.end, 1);
      this.counts.enqueued += 1;
    }
    return true;
  }

  /** Queue a loss report for every run that lost events, while there is room (`evict`: make room). */
  private reportLosses(evict: boolean): void {
    if (this.lost.size === 0) return;
    const build = this.options.lossReport;
    const pending = [...this.lost];
    this.lost.clear();
    for (const [key, count] of pending) {
      const record = build ? safely(() => build(key, count)) : undefined;
      if (!record) continue; // nothing to report with: counted and logged already
      if (!evict && this.full()) {
        this.lost.set(key, (this.lost.get(key) ?? 0) + count);
        continue;
      }
      this.admit({ record, priority: PRIORITY.end, reports: count });
    }
  }

  // A method, so that TypeScript does not narrow the field across awaits (close() sets it).
  private abandoned(): boolean {
    return this.closing === 'abandon';
  }

  private async pump(): Promise<void> {
    try {
      while (this.queue.length > 0 && this.closing !== 'abandon') {
        const batch = this.queue.splice(0, this.maxBatch);
        for (const entry of batch) {
          this.rank(entry.priority, -1);
          if (this.queuedEnds.get(entry.record.key) === entry) this.queuedEnds.delete(entry.record.key);
        }
        this.inFlight = batch;
        try {
          await this.sendWithin(batch.map((entry) => entry.record));
          this.counts.published += batch.length;
          // close() gave up while this batch was in flight and counted its events as dropped
          if (this.abandoned()) this.counts.dropped -= events(batch);
          this.backoffMs = 0;
          this.inFlight = [];
          // There is room again: tell loopwarden which runs lost events.
          if (!this.abandoned()) this.reportLosses(false);
        } catch (error) {
          this.counts.sinkErrors += 1;
          try {
            this.options.onSinkError?.(error);
          } catch {
            // a failing error hook must not stop the pump
          }
          if (this.abandoned()) break;
          // Put the batch back in front, in order, and wait before trying again.
          this.queue.unshift(...batch);
          for (const entry of batch) {
            this.rank(entry.priority, 1);
            if (entry.priority === PRIORITY.end && entry.reports === 0 && !this.queuedEnds.has(entry.record.key)) {
              this.queuedEnds.set(entry.record.key, entry);
            }
          }
          this.inFlight = [];
          this.backoffMs = Math.min(this.maxBackoffMs, this.backoffMs === 0 ? this.initialBackoffMs : this.backoffMs * 2);
          await new Promise<void>((resolve) => {
            this.wakeRetry = resolve;
            this.retryTimer = setTimeout(resolve, this.backoffMs);
            // A dead broker must not keep the process alive; `flush` re-arms a ref'd wait.
            this.retryTimer.unref?.();
          });
          this.wakeRetry = undefined;
        } finally {
          this.inFlight = [];
        }
      }
    } finally {
      this.pumping = false;
      if (this.queue.length > 0 && this.closing !== 'abandon') {
        this.pumping = true;
        setImmediate(() => void this.pump());
      } else {
        const waiters = this.idleWaiters;
        this.idleWaiters = [];
        waiters.forEach((w) => w());
      }
    }
  }

  private async sendWithin(records: SinkRecord[]): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        Promise.resolve().then(() => this.sink.send(records)),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            try {
              this.sink.reset?.();
            } catch {
              // a failing reset is a failing sink: the retry will tell
            }
            reject(new Error(`sink send did not settle within ${this.sendTimeoutMs} ms`));
          }, this.sendTimeoutMs);
          timer.unref?.();
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Wait until everything queued so far was delivered, or `timeoutMs` passed.
   * Resolves true when the queue is empty. Never rejects.
   */
  async flush(timeoutMs = 10_000): Promise<boolean> {
    if (this.queue.length === 0 && this.inFlight.length === 0 && !this.pumping) return true;
    // Retry now rather than after the current backoff.
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.wakeRetry?.();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const idle = new Promise<boolean>((resolve) => this.idleWaiters.push(() => resolve(true)));
    const timeout = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
    });
    const drained = await Promise.race([idle, timeout]);
    if (timer) clearTimeout(timer);
    return drained && this.queue.length === 0;
  }

  /**
   * Report the runs that lost events, flush, then close the sink, all within `timeoutMs` (default
   * 10 000): the flush may take the budget less a reserve (a quarter, at most 1 s) and the sink's
   * close gets what is left. Events still undelivered then are counted as dropped and logged with
   * their runs. Later `enqueue` calls are dropped. Never rejects, and returns by the deadline
   * whatever the sink does.
   */
  async close(timeoutMs = 10_000): Promise<PublisherStats> {
    if (!this.closed) {
      unwatchExit(this);
      const deadline = Date.now() + Math.max(0, timeoutMs);
      const reserve = Math.min(1_000, Math.max(0, timeoutMs) / 4);
      this.closing = 'flushing';
      this.closed = true;
      this.reportLosses(true);
      let drained = await this.flush(Math.max(0, timeoutMs - reserve));
      if (drained && this.lost.size > 0) {
        // reports that found no room before the last batches went out
        this.reportLosses(true);
        drained = await this.flush(Math.max(0, deadline - reserve / 2 - Date.now()));
      }
      if (!drained) {
        this.closing = 'abandon';
        // Queued and in-flight events count as dropped (an in-flight batch that still lands is
        // moved back to published by the pump).
        const left = [...this.queue, ...this.inFlight];
        for (const entry of left) {
          if (entry.reports === 0) this.counts.dropped += 1;
          this.lost.set(entry.record.key, (this.lost.get(entry.record.key) ?? 0) + Math.max(entry.reports, 1));
        }
        this.queue.length = 0;
        this.ranked.fill(0);
        this.queuedEnds.clear();
        if (this.retryTimer) clearTimeout(this.retryTimer);
        this.wakeRetry?.();
      }
      this.logLost('closing');
      const left = Math.max(0, deadline - Date.now());
      await settleWithin(() => this.sink.close(left), left); // closing is best effort
    }
    return this.stats();
  }

  /**
   * The event loop emptied (`beforeExit`) and the application never called close(): deliver what
   * can be delivered within `exitFlushMs`, count and log the rest, close the sink so nothing holds
   * the process, and let it exit.
   */
  /** @internal The process is exiting now (`process.exit`): count and log what is left, synchronously. */
  exitNow(): void {
    if (this.closed && this.closing !== 'flushing') return;
    this.closed = true;
    unwatchExit(this);
    for (const entry of [...this.queue, ...this.inFlight]) {
      if (entry.reports === 0) this.counts.dropped += 1;
      this.lost.set(entry.record.key, (this.lost.get(entry.record.key) ?? 0) + Math.max(entry.reports, 1));
    }
    this.closing = 'abandon';
    this.queue.length = 0;
    this.logLost('process exiting');
  }

  private logLost(when: string): void {
    if (this.lost.size === 0) return;
    const runs = [...this.lost];
    const total = runs.reduce((n, [, c]) => n + c, 0);
    const named = runs.slice(0, 10).map(([key, c]) => `${JSON.stringify(key)} (${c})`).join(', ');
    writeLine(
      this.options.logger ?? console,
      `loopwarden: ${when}: ${total} event(s) of ${runs.length} run(s) were lost and could not be reported ` +
        `(sink unavailable): ${named}${runs.length > 10 ? `, and ${runs.length - 10} more runs` : ''}`,
    );
    this.lost.clear();
  }

  /** @internal */
  exitWithoutClose(): void {
    if (this.closed) return;
    if (this.queue.length === 0 && this.inFlight.length === 0 && this.lost.size === 0) {
      // Nothing to deliver: release the sink's connections (a healthy broker's would keep the
      // process alive), without waiting.
      unwatchExit(this);
      this.closed = true;
      void settleWithin(() => this.sink.close(this.exitFlushMs), this.exitFlushMs);
      return;
    }
    void this.close(this.exitFlushMs);
  }
}

// One beforeExit listener for every open publisher (weakly held: a publisher nobody closes and
// nothing references any more is not kept alive by it).
const open = new Set<WeakRef<Publisher>>();
const refs = new WeakMap<Publisher, WeakRef<Publisher>>();
let listening = false;

function watchExit(publisher: Publisher): void {
  const ref = new WeakRef(publisher);
  refs.set(publisher, ref);
  open.add(ref);
  if (open.size % 256 === 0) for (const r of open) if (r.deref() === undefined) open.delete(r);
  if (!listening) {
    listening = true;
    process.on('beforeExit', () => {
      for (const r of [...open]) r.deref()?.exitWithoutClose();
    });
    // process.exit() skips beforeExit: nothing can be sent any more, but the loss is still told.
    process.on('exit', () => {
      for (const r of [...open]) r.deref()?.exitNow();
    });
  }
}

function unwatchExit(publisher: Publisher): void {
  const ref = refs.get(publisher);
  if (ref) open.delete(ref);
}

function events(batch: readonly Entry[]): number {
  let n = 0;
  for (const entry of batch) if (entry.reports === 0) n += 1;
  return n;
}

function safely<T>(fn: () => T): T | undefined {
  try {
    return fn();
  } catch {
    return undefined;
  }
}

function writeLine(logger: SinkLogger, line: string): void {
  try {
    (logger.warn ?? logger.error).call(logger, line);
  } catch {
    // a failing logger must not reach the caller
  }
}
