// Validates custom resources (PrometheusRule, ServiceMonitor, ScaledObject) against their CRDs'
// OpenAPI schemas as published in the kubernetes-models packages; built-in kinds are checked by
// kubernetes-validate in tests/unit/test_monitoring.py.
//   node k8s/validate/validate.mjs FILE.yaml...   one JSON line per object; exit 1 if any is invalid
import { readFileSync } from 'node:fs';
import { parseAllDocuments } from 'yaml';
import { PrometheusRule, ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1';

const KINDS = { PrometheusRule, ServiceMonitor, ScaledObject };
let invalid = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
    const obj = doc.toJS();
    if (!obj) continue;
    const Model = KINDS[obj.kind];
    const out = { file, kind: obj.kind, name: obj.metadata?.name };
    if (!Model) {
      out.skipped = 'not a custom resource this validator knows';
    } else {
      try {
        new Model(obj).validate();
        out.ok = true;
      } catch (err) {
        out.ok = false;
        out.error = err.message;
        invalid += 1;
      }
    }
    console.log(JSON.stringify(out));
  }
}
process.exit(invalid ? 1 : 0);
