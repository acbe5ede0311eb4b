#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft) without Docker.
#   dev/kafka/kafka.sh fetch                        # download broker jars (Maven), idempotent
#   dev/kafka/kafka.sh run   [--port 9092] [--dir .kafka]   # foreground, Ctrl-C stops
#   dev/kafka/kafka.sh start [--port 9092] [--dir .kafka]   # background, prints bootstrap
#   dev/kafka/kafka.sh stop  [--dir .kafka]
# Thin wrapper around `python -m dev.localkafka`; runs from any directory
# (a relative --dir is relative to the current directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m dev.localkafka "$@"
