"""deploy/otel-collector.yaml keeps exactly what the bridge reads: its filter agrees with the decoder and mapping."""

from __future__ import annotations

import re

import yaml

from loopwarden.stages.otel.mapping import BY_SCOPE, RUNTIMES
from loopwarden.stages.otel.spans import JSONTEXT, KNOWN
from tests.conftest import REPO

CONFIG = yaml.safe_load((REPO / "deploy" / "otel-collector.yaml").read_text())
PROCESSORS = CONFIG["processors"]
STATEMENTS = [s for group in PROCESSORS["transform/content"]["trace_statements"] for s in group["statements"]]
CONDITIONS = PROCESSORS["filter/unread"]["trace_conditions"]


def _statement(prefix: str) -> list[str]:
    return [s for s in STATEMENTS if s.startswith(prefix)]


def _quoted(text: str) -> list[str]:
    return re.findall(r'"((?:[^"\\]|\\.)*)"', text)


def test_kept_attribute_keys_are_the_decoders_mapped_keys():
    """The span attributes the Collector keeps are spans.KNOWN: none the bridge reads is dropped, none else kept."""
    (keep,) = _statement("keep_keys(span.attributes,")
    json_keys = {key for key, kind in KNOWN.items() if kind == JSONTEXT}
    assert set(_quoted(keep)) == set(KNOWN) - json_keys
    # a JSON-text attribute survives only as the keys the mapping reads of it, re-serialised
    assert json_keys == {"metadata"}
    (meta,) = _statement('keep_keys(span.cache["metadata"]')
    read = {key for row in RUNTIMES for key, _v in row.run_metadata} | {
        key for row in RUNTIMES
        for key in (row.run_metadata_absent, row.node_metadata, row.thread_metadata, row.nested_metadata)}
    assert set(_quoted(meta.split(",", 1)[1].split("]")[0])) == read - {""}
    assert _statement('set(span.attributes["metadata"], String(span.cache["metadata"]))')


def test_spans_are_dropped_only_when_no_row_would_read_them():
    """The filter drops spans of no mapped scope, with no row-selecting attribute, and never an INTERNAL one."""
    (spans,) = [c for c in CONDITIONS if c.startswith("span.")]
    scopes = set(re.findall(r'instrumentation_scope\.name == "([^"]+)"', spans))
    markers = set(re.findall(r'span\.attributes\["([^"]+)"\] == nil', spans))
    assert scopes == set(BY_SCOPE)
    # the attributes (and span-name prefix) select_runtime and classify choose a row or role by
    assert markers == {"gen_ai.operation.name", "openinference.span.kind", "ai.operationId"}
    assert 'IsMatch(span.name, "^ai\\\\.")' in spans
    assert spans.startswith("span.kind != SPAN_KIND_INTERNAL and span.kind != SPAN_KIND_UNSPECIFIED")
    assert [c for c in CONDITIONS if c.startswith("spanevent.")] == ['spanevent.name != "exception"']
    assert _statement("keep_keys(spanevent.attributes,") == ['keep_keys(spanevent.attributes, ["exception.type"])']


def test_span_names_are_kept_only_where_the_bridge_reads_them():
    """A name stays on run spans (every row's run operations and kinds) and ai.* spans; status messages keep only the mapped prefixes."""
    (names,) = _statement("set(span.name,")
    run_ops = {op for row in RUNTIMES for op in row.run_ops}
    run_kinds = {kind for row in RUNTIMES for kind in row.run_kinds}
    ops = set(re.findall(r'span\.attributes\["gen_ai\.operation\.name"\] == "([^"]+)"', names))
    kinds = set(re.findall(r'span\.attributes\["openinference\.span\.kind"\] == "([^"]+)"', names))
    assert (ops, kinds) == (run_ops, run_kinds)
    assert {row.run_names for row in RUNTIMES if row.run_names} == {("ai.generateText", "ai.streamText")}
    prefixes = {prefix for row in RUNTIMES for prefix, _exc in row.status_exceptions}
    kept = {_quoted(s)[0] for s in _statement("set(span.status.message,") if _quoted(s)[0]}
    assert kept == prefixes
    (cleared,) = [s for s in _statement("set(span.status.message,") if s.startswith('set(span.status.message, "")')]
    assert set(re.findall(r'IsMatch\(span\.status\.message, "\^([^"]+)"\)', cleared)) == prefixes


def test_resource_and_scope_attributes_are_dropped():
    """No resource or scope attribute reaches Kafka: the bridge reads none."""
    assert "keep_keys(resource.attributes, [])" in STATEMENTS and "keep_keys(scope.attributes, [])" in STATEMENTS


def test_pipeline_filters_before_it_batches_and_exports():
    """memory_limiter first, then the content filters, then a 200 ms batch, then the Kafka exporter."""
    pipeline = CONFIG["service"]["pipelines"]["traces"]
    assert pipeline["processors"] == ["memory_limiter", "filter/unread", "transform/content", "batch"]
    assert pipeline["exporters"] == ["kafka"] and PROCESSORS["batch"]["timeout"] == "200ms"
    # a failing statement (metadata that is not JSON) must not log the value it failed on
    assert PROCESSORS["transform/content"]["error_mode"] == "silent"
