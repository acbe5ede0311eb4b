package dev.loopwarden.bench;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Kafka Streams peer of bench/ingest.py: the Quix peer's job (bench/peers/quix_app.py) on the JVM.
 *
 * <p>Both input topics (JSON values keyed by run id) merged into one stream; per input, the run's
 * count is read from and written to a persistent key-value store (RocksDB, changelogged) and one
 * JSON output {"type": ..., "n": count} (values parsed and written with Jackson, as Quix
 * parses and writes JSON) goes to the output topic. exactly_once_v2, one stream
 * thread, record cache off (statestore.cache.max.bytes=0): each input gives one output; every other
 * setting at Kafka Streams' defaults (commit.interval.ms is 100 under exactly-once).
 *
 * <p>Configured by environment as the Python peers: PEER_BROKER, PEER_GROUP, PEER_STEPS, PEER_OUTCOMES,
 * PEER_OUTPUT, PEER_STATE_DIR, PEER_READY_FILE, and PEER_TOTAL + PEER_PROGRESS_FILE for the
 * steady-state marks (bench/peers/__init__.py describes both files).
 */
public final class CountPeer {
    private static final String STORE = "counts";

    private static double monotonic() {
        return System.nanoTime() / 1e9; // CLOCK_MONOTONIC on Linux, as Python's time.monotonic()
    }

    private static double cpu() {
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        return os.getProcessCpuTime() / 1e9;
    }

    private static void writeReady(String path) {
        try {
            Path tmp = Path.of(path + ".tmp");
            Files.writeString(tmp, String.format("{\"t\": %.6f, \"cpu\": %.6f}", monotonic(), cpu()));
            Files.move(tmp, Path.of(path), StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    private static void appendMark(String path, long n) {
        try {
            Files.writeString(Path.of(path), String.format("{\"n\": %d, \"t\": %.6f, \"cpu\": %.6f}%n", n, monotonic(), cpu()),
                    StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    /** Messages handled by all tasks (one per input partition pair) of the one stream thread. */
    static final class Progress {
        private final String readyFile = System.getenv("PEER_READY_FILE");
        private final String progressFile = System.getenv("PEER_PROGRESS_FILE");
        private final long[] marks;
        private int nextMark = 0;
        private long seen = 0;

        Progress(long total) {
            marks = total > 0 ? new long[] {Math.max(1, total / 10), Math.max(1, total * 9 / 10)} : new long[0];
        }

        synchronized void tick() {
            if (++seen == 1 && readyFile != null) writeReady(readyFile);
            if (nextMark < marks.length && seen == marks[nextMark] && progressFile != null) {
                appendMark(progressFile, seen);
                nextMark++;
            }
        }
    }

    /** The count per run and one output per input. */
    static final class Count implements FixedKeyProcessor<String, byte[], byte[]> {
        private final Progress progress;
        private FixedKeyProcessorContext<String, byte[]> context;
        private KeyValueStore<String, Long> store;

        Count(Progress progress) {
            this.progress = progress;
        }

        @Override
        public void init(FixedKeyProcessorContext<String, byte[]> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
        }

        @Override
        public void process(FixedKeyRecord<String, byte[]> record) {
            progress.tick();
            Long n = store.get(record.key());
            long next = n == null ? 1 : n + 1;
            store.put(record.key(), next);
            ObjectNode out = JSON.createObjectNode();
            try {
                out.put("type", JSON.readTree(record.value()).path("type").asText());
                out.put("n", next);
                context.forward(record.withValue(JSON.writeValueAsBytes(out)));
            } catch (IOException e) {
                throw new RuntimeException(e); // the bench's inputs are valid JSON
            }
        }
    }

    public static void main(String[] args) throws InterruptedException {
        long total = Long.parseLong(System.getenv().getOrDefault("PEER_TOTAL", "0"));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, System.getenv("PEER_GROUP"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, System.getenv("PEER_BROKER"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getenv("PEER_STATE_DIR"));
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long()).withCachingDisabled());
        Consumed<String, byte[]> consumed = Consumed.with(Serdes.String(), Serdes.ByteArray());
        KStream<String, byte[]> in = builder.stream(System.getenv("PEER_STEPS"), consumed)
                .merge(builder.stream(System.getenv("PEER_OUTCOMES"), consumed));
        Progress progress = new Progress(total);
        in.processValues(() -> new Count(progress), STORE)
                .to(System.getenv("PEER_OUTPUT"), Produced.with(Serdes.String(), Serdes.ByteArray()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            stopped.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        stopped.await();
    }
}
