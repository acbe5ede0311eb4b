/**
 * A bounded, non-blocking queue in front of a sink.
 *
 * `enqueue` never waits and never throws: the agent's loop must not slow down or fail because
 * Kafka does. Records are sent in order, in batches, by one background pump; a failed batch is
 * retried with exponential backoff. When the queue is full (Kafka down for longer than the queue
 * lasts) the *new* record is dropped and counted, so what was queued stays an unbroken prefix of
 * each run (loopwarden then sees a step gap or a missing end, never reordered events).
 */
import type { Sink, SinkRecord } from './sinks.js';
import { settleWithin } from './timing.js';

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
}

export interface PublisherStats {
  /** records accepted into the queue */
  enqueued: number;
  /** records the sink acknowledged */
  published: number;
  /** records refused because the queue was full */
  dropped: number;
  /** failed `send` attempts */
  sinkErrors: number;
  /** records waiting now (queued plus in flight; 0 after close) */
  pending: number;
}

export class Publisher {
  private readonly queue: SinkRecord[] = [];
  private inFlight: readonly SinkRecord[] = [];
  private pumping = false;
  private closed = false;
  /** 'abandon' once close() gave up on a sink that stays down */
  private closing: 'no' | 'flushing' | 'abandon' = 'no';
  private backoffMs = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private wakeRetry: (() => void) | undefined;
  private idleWaiters: Array<() => void> = [];
  private readonly counts = { enqueued: 0, published: 0, dropped: 0, sinkErrors: 0 };
  private readonly maxQueue: number;
  private readonly maxBatch: number;
  private readonly initialBackoffMs: number;
  private readonly maxBackoffMs: number;

  constructor(
    private readonly sink: Sink,
    private readonly options: PublisherOptions = {},
  ) {
    this.maxQueue = Math.max(1, options.maxQueue ?? 10_000);
    this.maxBatch = Math.max(1, options.maxBatch ?? 500);
    this.initialBackoffMs = Math.max(1, options.initialBackoffMs ?? 100);
    this.maxBackoffMs = Math.max(this.initialBackoffMs, options.maxBackoffMs ?? 5_000);
  }

  /** Queue one record; false when it was dropped (queue full or publisher closed). */
  enqueue(record: SinkRecord): boolean {
    if (this.closed || this.queue.length + this.inFlight.length >= this.maxQueue) {
      this.counts.dropped += 1;
      return false;
    }
    this.queue.push(record);
    this.counts.enqueued += 1;
    if (!this.pumping) {
      this.pumping = true;
      // Start on a later tick: the caller (an SDK callback) returns first.
      setImmediate(() => void this.pump());
    }
    return true;
  }

  stats(): PublisherStats {
    const pending = this.closing === 'abandon' ? 0 : this.queue.length + this.inFlight.length;
    return { ...this.counts, pending };
  }

  // A method, so that TypeScript does not narrow the field across awaits (close() sets it).
  private abandoned(): boolean {
    return this.closing === 'abandon';
  }

  private async pump(): Promise<void> {
    try {
      while (this.queue.length > 0 && this.closing !== 'abandon') {
        const batch = this.queue.splice(0, this.maxBatch);
        this.inFlight = batch;
        try {
          await this.sink.send(batch);
          this.counts.published += batch.length;
          // close() gave up while this batch was in flight and counted it as dropped
          if (this.abandoned()) this.counts.dropped -= batch.length;
          this.backoffMs = 0;
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
   * Flush, then close the sink, all within `timeoutMs` (default 10 000): the flush may take the
   * budget less a reserve (a quarter, at most 1 s) and the sink's close gets what is left. Records
   * still undelivered then are counted as dropped. Later `enqueue` calls are dropped. Never
   * rejects, and returns by the deadline whatever the sink does.
   */
  async close(timeoutMs = 10_000): Promise<PublisherStats> {
    if (!this.closed) {
      const deadline = Date.now() + Math.max(0, timeoutMs);
      const reserve = Math.min(1_000, Math.max(0, timeoutMs) / 4);
      this.closing = 'flushing';
      this.closed = true;
      const drained = await this.flush(Math.max(0, timeoutMs - reserve));
      if (!drained) {
        this.closing = 'abandon';
        // Queued and in-flight records count as dropped (an in-flight batch that still lands is
        // moved back to published by the pump).
        this.counts.dropped += this.queue.length + this.inFlight.length;
        this.queue.length = 0;
        if (this.retryTimer) clearTimeout(this.retryTimer);
        this.wakeRetry?.();
      }
      const left = Math.max(0, deadline - Date.now());
      await settleWithin(() => this.sink.close(left), left); // closing is best effort
    }
    return this.stats();
  }
}
