"""The OpenTelemetry bridge (spec.md section 9): TracesData on ``otlp_spans`` -> run events on ``agent.steps``.

``spans`` decodes messages into content-free spans, ``mapping`` holds one row per agent runtime,
``fold`` is the pure core (per-trace state -> events), ``task`` the per-partition stage the engine runs.
``hook`` is the producer side, imported on its own (it needs the OpenTelemetry SDK): what a Python
runtime's spans cannot tell, recorded by the application as ``loopwarden.*`` attributes.
"""

from loopwarden.stages.otel.fold import Limits, TraceState, fold_trace, run_id_of
from loopwarden.stages.otel.mapping import RUNTIMES, Runtime
from loopwarden.stages.otel.spans import BadTraces, Span, decode_traces
from loopwarden.stages.otel.task import BridgeTask, Folded, Output

__all__ = [
    "RUNTIMES", "BadTraces", "BridgeTask", "Folded", "Limits", "Output", "Runtime", "Span", "TraceState",
    "decode_traces", "fold_trace", "run_id_of",
]
