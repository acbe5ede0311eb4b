/**
 * Where events go: a tiny sink interface, an in-memory sink for tests, a Kafka sink (kafkajs).
 *
 * Sinks only move bytes. Queueing, retries and dropping live in the Publisher, so a sink may be
 * slow or fail without ever touching the agent.
 */
import { decodeEvent, type LoopwardenEvent } from './events.js';

/** One message: the topic, the key (the run id) and the JSON text of one event. */
export interface SinkRecord {
  topic: string;
  key: string;
  value: string;
}

export interface Sink {
  /** Deliver the records in order; reject to have the publisher retry the same batch later. */
  send(records: readonly SinkRecord[]): Promise<void>;
  /** Release connections. Called once, after the final flush. */
  close(): Promise<void>;
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

export interface KafkaSinkOptions {
  /** `host:port` list; ignored when `kafka` (a ready kafkajs client config) is given. */
  brokers?: string[];
  clientId?: string;
  /** Full kafkajs client config, for SSL/SASL and the like. */
  kafka?: KafkaConfig;
  producer?: ProducerConfig;
  /** kafkajs log level (0 NOTHING .. 5 DEBUG); default 1 (ERROR). */
  logLevel?: number;
}

/**
 * Publishes to Kafka with kafkajs, keyed by run id, header `content-type: application/json`.
 *
 * Uses kafkajs' Java-compatible murmur2 partitioner (`Partitioners.DefaultPartitioner`), the same
 * as the Java client and aiokafka, so a run lands in the same partition number on `agent.steps`
 * and `agent.outcomes` (spec.md: co-partitioned by run_id). kafkajs' own retries are kept short:
 * the publisher retries a failed batch with backoff and counts drops.
 */
export class KafkaSink implements Sink {
  private producer: Producer | undefined;
  private connecting: Promise<Producer> | undefined;

  constructor(private readonly options: KafkaSinkOptions) {
    if (!options.kafka && (!options.brokers || options.brokers.length === 0)) {
      throw new Error('KafkaSink needs brokers (host:port list) or a kafkajs config');
    }
  }

  private async connect(): Promise<Producer> {
    if (this.producer) return this.producer;
    this.connecting ??= (async () => {
      const kafkajs: KafkaJs = await import('kafkajs');
      const kafka = new kafkajs.Kafka({
        clientId: this.options.clientId ?? 'loopwarden-ai-sdk',
        brokers: this.options.brokers ?? [],
        logLevel: this.options.logLevel ?? kafkajs.logLevel.ERROR,
        retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 1000 },
        ...this.options.kafka,
      });
      const producer = kafka.producer({
        createPartitioner: kafkajs.Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: true,
        ...this.options.producer,
      });
      await producer.connect();
      this.producer = producer;
      return producer;
    })().finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  async send(records: readonly SinkRecord[]): Promise<void> {
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

  async close(): Promise<void> {
    const producer = this.producer ?? (this.connecting ? await this.connecting.catch(() => undefined) : undefined);
    this.producer = undefined;
    await producer?.disconnect();
  }
}
