/**
 * Recovery actions for the application to carry out (docs/actions.md in the loopwarden repository).
 *
 * loopwarden decides and publishes `recovery_action`s on `agent.actions`; only the application can
 * start its agent. A source hands the records over in order; `Loopwarden.onAction` decodes each,
 * drops repeats by `action_id`, waits until it is due (`not_before_ts`) and calls the handler,
 * retrying a handler that throws. A record counts as consumed (its offset committed) only once the
 * handler returned: at least once, and never lost to a crash of the application.
 */
import type { RecoveryAction } from './events.js';
import { RateLimitedLog, kafkaLogLine, type SinkLogger } from './sinks.js';
import { settleWithin } from './timing.js';

type KafkaConfig = import('kafkajs').KafkaConfig;
type Consumer = import('kafkajs').Consumer;
type LogEntry = import('kafkajs').LogEntry;

/**
 * Called for each record in order (per partition); the record is consumed once the promise resolves.
 * `keepAlive` tells the source the record is still being worked on (a due time may be minutes away).
 */
export type ActionRecordHandler = (value: string, keepAlive: () => Promise<void>) => Promise<void>;

/** Where actions come from: KafkaActionSource (agent.actions) or MemoryActionSource (tests). */
export interface ActionSource {
  /** Start handing records to `handle`; `defaults.groupId` is the consumer group onAction proposes. */
  start(handle: ActionRecordHandler, defaults: { groupId: string }): Promise<void>;
  /** Stop; a record whose handling was cut short is not consumed (it comes again). */
  close(): Promise<void>;
}

/** Records pushed in memory, handled one after another (for tests and for feeding actions by hand). */
export class MemoryActionSource implements ActionSource {
  /** the records consumed (handled to the end), in order */
  readonly consumed: string[] = [];
  private handle: ActionRecordHandler | undefined;
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  async start(handle: ActionRecordHandler): Promise<void> {
    this.handle = handle;
  }

  /** Hand records over in order; resolves when each was consumed or cut short by close(). */
  push(...records: Array<string | RecoveryAction>): Promise<void> {
    for (const record of records) {
      const value = typeof record === 'string' ? record : JSON.stringify(record);
      this.chain = this.chain.then(async () => {
        if (this.closed || !this.handle) return;
        try {
          await this.handle(value, async () => undefined);
          this.consumed.push(value);
        } catch {
          // cut short by close(): not consumed
        }
      });
    }
    return this.chain;
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}

export interface KafkaActionSourceOptions {
  /** `host:port` list; ignored when `kafka` (a ready kafkajs client config) is given. */
  brokers?: string[];
  clientId?: string;
  /** Full kafkajs client config, for SSL/SASL and the like. */
  kafka?: KafkaConfig;
  /** Default `agent.actions`. */
  topic?: string;
  /**
   * The consumer group: the processes of one group share the actions (each action is handled by one
   * of them). Default: the one onAction proposes, `loopwarden-actions.<agent>`.
   */
  groupId?: string;
  /** Partitions handled at once (default 8): an action waiting for its due time holds back only its own. */
  partitionsConcurrently?: number;
  /** Receives the Kafka client's log lines (rate-limited, one line each). Default: `console`. */
  logger?: SinkLogger;
}

/**
 * Reads `agent.actions` with kafkajs, committed records only (the worker publishes actions in
 * transactions), from the group's committed offsets (from the beginning for a new group). An
 * offset is committed after the handler of its record returned.
 */
export class KafkaActionSource implements ActionSource {
  private consumer: Consumer | undefined;
  private closed = false;
  readonly log: RateLimitedLog;

  constructor(private readonly options: KafkaActionSourceOptions) {
    if (!options.kafka && (!options.brokers || options.brokers.length === 0)) {
      throw new Error('KafkaActionSource needs brokers (host:port list) or a kafkajs config');
    }
    this.log = new RateLimitedLog(options.logger ?? console, 5, 60_000);
  }

  async start(handle: ActionRecordHandler, defaults: { groupId: string }): Promise<void> {
    const kafkajs = await import('kafkajs');
    const kafka = new kafkajs.Kafka({
      clientId: this.options.clientId ?? 'loopwarden-ai-sdk-actions',
      brokers: this.options.brokers ?? [],
      logLevel: kafkajs.logLevel.ERROR,
      logCreator: () => (entry: LogEntry) => {
        if (!this.closed) this.log.write(entry.level <= 1 ? 'error' : 'warn', kafkaLogLine(entry));
      },
      ...this.options.kafka,
    });
    const consumer = kafka.consumer({ groupId: this.options.groupId ?? defaults.groupId, readUncommitted: false });
    this.consumer = consumer;
    await consumer.connect();
    await consumer.subscribe({ topics: [this.options.topic ?? 'agent.actions'], fromBeginning: true });
    await consumer.run({
      autoCommit: true,
      partitionsConsumedConcurrently: this.options.partitionsConcurrently ?? 8,
      eachMessage: async ({ message, heartbeat }) => {
        if (message.value === null) return;
        await handle(message.value.toString('utf8'), heartbeat);
      },
    });
  }

  async close(timeoutMs = 10_000): Promise<void> {
    this.closed = true;
    const consumer = this.consumer;
    this.consumer = undefined;
    if (consumer) await settleWithin(() => consumer.disconnect(), timeoutMs);
  }
}

/** What onAction counted. */
export interface ActionStats {
  /** actions the handler returned from */
  handled: number;
  /** records dropped as a repeat of an action_id already handled */
  repeats: number;
  /** records that are not a valid recovery_action (told to onInternalError, skipped) */
  invalid: number;
  /** actions of another agent, or that `accept` left out */
  skipped: number;
  /** times the handler threw (the action was retried) */
  handlerErrors: number;
}

/** A running onAction: its counts, and `close()` to stop receiving. */
export interface ActionSubscription {
  /** Resolves once the source is reading; rejects when it could not start (e.g. Kafka unreachable). */
  ready: Promise<void>;
  stats(): ActionStats;
  close(): Promise<void>;
}

export interface OnActionOptions {
  /** Where the actions come from; default the client's `actions` option. */
  source?: ActionSource;
  /**
   * Whose actions: agent.actions carries every agent's, and each action names its run's agent. Default:
   * the client's `agent`. The consumer group is `loopwarden-actions.<agent>`.
   */
  agent?: string;
  /** Which of that agent's actions are this process's, when it runs only some of its jobs (e.g. `(a) => a.job_id.startsWith('invoice-')`). Default: all. */
  accept?: (action: RecoveryAction) => boolean;
  /** First and longest wait before a handler that threw is called again with the same action (ms). */
  retryFirstMs?: number;
  retryMaxMs?: number;
}

/** Thrown into the source for a record whose handling close() cut short, so it is not consumed. */
export class ActionHandlingStopped extends Error {
  constructor() {
    super('onAction was closed before the action was handled');
    this.name = 'ActionHandlingStopped';
  }
}
