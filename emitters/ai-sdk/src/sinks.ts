/**
 * Where events go: a tiny sink interface, an in-memory sink for tests, a Kafka sink (kafkajs).
 *
 * Sinks only move bytes. Queueing, retries and dropping live in the Publisher, so a sink may be
 * slow or fail without ever touching the agent.
 */
import { decodeEvent, type LoopwardenEvent } from './events.js';
import { settleWithin } from './timing.js';

/** One message: the topic, the key (the run id) and the JSON text of one event. */
export interface SinkRecord {
  topic: string;
  key: string;
  value: string;
}

export interface Sink {
  /** Deliver the records in order; reject to have the publisher retry the same batch later. */
  send(records: readonly SinkRecord[]): Promise<void>;
  /**
   * Release connections. Called once, after the final flush, with the time left of the
   * publisher's close budget; should settle within it (the publisher stops waiting then anyway).
   */
  close(timeoutMs?: number): Promise<void>;
  /**
   * Optional: drop the connection after a send the publisher gave up waiting for (a broker that
   * accepts and never answers), so that the next send starts afresh.
   */
  reset?(): void;
}

/** Keeps every record in memory, in delivery order. `down = true` makes `send` fail (Kafka down). */
export class MemorySink implements Sink {
  readonly records: SinkRecord[] = [];
  down = false;
  closed = false;

  async send(records: readonly SinkRecord[]): Promise<void> {
    if (this.down) throw new Error('MemorySink is down');
    this.records.push(...records);
  }

  async close(): Promise<void> {
    this.closed = true;
  }

  /** The events delivered (optionally only those of one topic), decoded and validated. */
  events(topic?: string): LoopwardenEvent[] {
    return this.records.filter((r) => topic === undefined || r.topic === topic).map((r) => decodeEvent(r.value));
  }

  /** JSON lines of all records, in delivery order (the format `loopwarden replay` reads). */
  jsonl(): string {
    return this.records.map((r) => `${r.value}\n`).join('');
  }
}

// kafkajs is imported lazily so that users of MemorySink (tests) do not load it.
type KafkaJs = typeof import('kafkajs');
type Producer = import('kafkajs').Producer;
type KafkaConfig = import('kafkajs').KafkaConfig;
type ProducerConfig = import('kafkajs').ProducerConfig;
type LogEntry = import('kafkajs').LogEntry;
type ISocketFactory = import('kafkajs').ISocketFactory;

/** Where the Kafka client's log lines go: `console`, pino, winston and the like fit. */
export interface SinkLogger {
  error(message: string): void;
  warn(message: string): void;
  info?(message: string): void;
  debug?(message: string): void;
}

export interface KafkaSinkOptions {
  /** `host:port` list; ignored when `kafka` (a ready kafkajs client config) is given. */
  brokers?: string[];
  clientId?: string;
  /** Full kafkajs client config, for SSL/SASL and the like. */
  kafka?: KafkaConfig;
  producer?: ProducerConfig;
  /** kafkajs log level (0 NOTHING .. 5 DEBUG); default 1 (ERROR). */
  logLevel?: number;
  /**
   * Receives the Kafka client's log lines, one line each, no stack traces, at most `logBurst`
   * lines per `logIntervalMs` (the rest are counted and reported with the next line let through).
   * Default: `console` (stderr for errors and warnings).
   */
  logger?: SinkLogger;
  /** Lines let through per interval (default 5) and the interval (default 60 000 ms). */
  logBurst?: number;
  logIntervalMs?: number;
  /**
   * Disconnect after this long without a send (default 1 000 ms; 0 = stay connected). A connected
   * kafkajs client keeps a timer running that holds the event loop, so without this a process
   * whose work is done would not exit while the connection stays open; the next send reconnects.
   */
  idleDisconnectMs?: number;
}

/**
 * A logger that lets at most `burst` lines through per `intervalMs` and counts the rest, so a
 * broker that stays down writes a few lines a minute, not dozens a second.
 */
export class RateLimitedLog {
  private windowStart = -Infinity;
  private inWindow = 0;
  private suppressed = 0;

  constructor(
    private readonly logger: SinkLogger,
    private readonly burst = 5,
    private readonly intervalMs = 60_000,
    private readonly now: () => number = Date.now,
    /** what a line is, in the note about held-back lines */
    private readonly noun = 'Kafka client line',
  ) {}

  write(level: 'error' | 'warn' | 'info' | 'debug', line: string): void {
    const t = this.now();
    if (t - this.windowStart >= this.intervalMs) {
      this.windowStart = t;
      this.inWindow = 0;
    }
    if (this.inWindow >= this.burst) {
      this.suppressed += 1;
      return;
    }
    this.inWindow += 1;
    if (this.suppressed > 0) {
      line += ` (${this.suppressed} more ${this.noun}${this.suppressed === 1 ? '' : 's'} suppressed before this one)`;
      this.suppressed = 0;
    }
    try {
      const write = this.logger[level] ?? this.logger.warn;
      write.call(this.logger, line);
    } catch {
      // a failing logger must not reach the Kafka client
    }
  }

  /** How many lines were held back and not yet reported. */
  get pendingSuppressed(): number {
    return this.suppressed;
  }
}

/** One line for a kafkajs log entry: level, namespace, message, broker; never the stack. */
export function kafkaLogLine(entry: LogEntry): string {
  const { message, broker } = entry.log;
  const where = typeof broker === 'string' ? ` (broker ${broker})` : '';
  return `loopwarden KafkaSink: kafkajs ${entry.label} [${entry.namespace}] ${String(message)}${where}`;
}

const LEVELS: Record<number, 'error' | 'warn' | 'info' | 'debug'> = { 1: 'error', 2: 'warn', 4: 'info', 5: 'debug' };

/**
 * Publishes to Kafka with kafkajs, keyed by run id, header `content-type: application/json`.
 *
 * Uses kafkajs' Java-compatible murmur2 partitioner (`Partitioners.DefaultPartitioner`), the same
 * as the Java client and aiokafka, so a run lands in the same partition number on `agent.steps`
 * and `agent.outcomes` (docs/contract.md: co-partitioned by run_id). kafkajs' own retries are kept short:
 * the publisher retries a failed batch with backoff and counts drops.
 *
 * `close(ms)` returns within `ms` whatever the broker does: it asks kafkajs to disconnect and
 * then destroys every socket the client opened (through kafkajs' public `socketFactory` hook), so
 * a broker that accepts connections and never answers cannot hold the process open. It logs
 * nothing: the publisher's stats say what was published and what was dropped.
 */
export class KafkaSink implements Sink {
  private producer: Producer | undefined;
  private created: Producer | undefined;
  private connecting: Promise<Producer> | undefined;
  private closed = false;
  private readonly sockets = new Set<import('node:net').Socket>();
  private sending = 0;
  private idleTimer: ReturnType<typeof setTimeout> | undefined;
  readonly log: RateLimitedLog;

  constructor(private readonly options: KafkaSinkOptions) {
    if (!options.kafka && (!options.brokers || options.brokers.length === 0)) {
      throw new Error('KafkaSink needs brokers (host:port list) or a kafkajs config');
    }
    this.log = new RateLimitedLog(options.logger ?? console, options.logBurst ?? 5, options.logIntervalMs ?? 60_000);
  }

  /** kafkajs' default socket factory (or the user's), with every socket remembered until it closes. */
  private async socketFactory(): Promise<ISocketFactory> {
    const user = this.options.kafka?.socketFactory;
    const net = await import('node:net');
    const tls = await import('node:tls');
    const base: ISocketFactory =
      user ??
      (({ host, port, ssl, onConnect }) => {
        // as kafkajs' own default factory (src/network/socketFactory.js)
        const socket = ssl
          ? tls.connect(Object.assign({ host, port }, !net.isIP(host) ? { servername: host } : {}, ssl), onConnect)
          : net.connect({ host, port }, onConnect);
        socket.setKeepAlive(true, 60_000);
        return socket;
      });
    return (args) => {
      const socket = base(args);
      if (this.closed) {
        socket.destroy(new Error('KafkaSink closed')); // closing: no new connections (fails at once)
        return socket;
      }
      this.sockets.add(socket);
      socket.once('close', () => this.sockets.delete(socket));
      // A connection to Kafka is never what keeps the process alive: an application that is done
      // exits (the publisher flushes within its bound on the way out, see Publisher).
      socket.unref();
      return socket;
    };
  }

  private async connect(): Promise<Producer> {
    if (this.producer) return this.producer;
    this.connecting ??= (async () => {
      const kafkajs: KafkaJs = await import('kafkajs');
      const socketFactory = await this.socketFactory();
      if (this.closed) throw new Error('KafkaSink is closed');
      const kafka = new kafkajs.Kafka({
        clientId: this.options.clientId ?? 'loopwarden-ai-sdk',
        brokers: this.options.brokers ?? [],
        logLevel: this.options.logLevel ?? kafkajs.logLevel.ERROR,
        retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 1000 },
        // Once close() has begun, kafkajs' lines are about the close itself (requests cut short, the
        // sockets this sink destroys): a clean close is quiet; what could not be sent is in the stats.
        logCreator: () => (entry: LogEntry) => {
          if (!this.closed) this.log.write(LEVELS[entry.level] ?? 'info', kafkaLogLine(entry));
        },
        // kafkajs enforces request timeouts with an interval that holds the event loop for as long
        // as a connection is open; the publisher times its sends out itself (sendTimeoutMs, unref'd).
        enforceRequestTimeout: false,
        ...this.options.kafka,
        socketFactory,
      });
      const producer = kafka.producer({
        createPartitioner: kafkajs.Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: true,
        ...this.options.producer,
      });
      this.created = producer;
      await producer.connect();
      if (this.closed) throw new Error('KafkaSink is closed');
      this.producer = producer;
      return producer;
    })().finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  async send(records: readonly SinkRecord[]): Promise<void> {
    if (this.closed) throw new Error('KafkaSink is closed');
    clearTimeout(this.idleTimer);
    this.sending += 1;
    try {
      await this.sendNow(records);
    } finally {
      this.sending -= 1;
      this.armIdle();
    }
  }

  private armIdle(): void {
    const ms = this.options.idleDisconnectMs ?? 1_000;
    if (ms <= 0 || this.sending > 0 || this.closed) return;
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(() => {
      if (this.sending > 0 || this.closed) return;
      const producer = this.producer ?? this.created;
      this.producer = undefined;
      this.created = undefined;
      this.connecting = undefined;
      if (producer) void settleWithin(() => producer.disconnect(), 5_000);
    }, ms);
    this.idleTimer.unref?.();
  }

  private async sendNow(records: readonly SinkRecord[]): Promise<void> {
    const producer = await this.connect();
    const byTopic = new Map<string, SinkRecord[]>();
    for (const record of records) {
      const list = byTopic.get(record.topic) ?? [];
      list.push(record);
      byTopic.set(record.topic, list);
    }
    await producer.sendBatch({
      topicMessages: [...byTopic].map(([topic, list]) => ({
        topic,
        messages: list.map((r) => ({ key: r.key, value: r.value, headers: { 'content-type': 'application/json' } })),
      })),
    });
  }

  /** Forget the producer and destroy its sockets: the next send connects again. */
  reset(): void {
    if (this.closed) return;
    this.producer = undefined;
    this.created = undefined;
    this.connecting = undefined;
    for (const socket of this.sockets) socket.destroy(new Error('KafkaSink reset after a send timed out'));
    this.sockets.clear();
  }

  /** Sockets open now (for tests and diagnostics). */
  openSockets(): number {
    return this.sockets.size;
  }

  /**
   * Disconnect, waiting at most `timeoutMs` (default 5 000) for kafkajs to do it politely, then
   * destroy what is still open. Never rejects; nothing of the client keeps the event loop alive.
   */
  async close(timeoutMs = 5_000): Promise<void> {
    this.closed = true;
    clearTimeout(this.idleTimer);
    const producer = this.producer ?? this.created;
    this.producer = undefined;
    if (producer) await settleWithin(() => producer.disconnect(), timeoutMs);
    // With an error: kafkajs listens for 'error' (not 'close') to fail its requests in flight and stop
    // its request-timeout interval; a plain destroy() would leave that running for requestTimeout.
    for (const socket of this.sockets) socket.destroy(new Error('KafkaSink closed'));
    this.sockets.clear();
  }
}
