// Validates custom resources (KEDA's, the Prometheus Operator's) against the schemas of
// their CRDs, as shipped by @kubernetes-models (validators generated from the projects'
// own API types): `node crds.mjs FILE...`, each a YAML stream of objects of such kinds.
// check.py sends it the rendered objects that are not Kubernetes' own (those go to
// kubernetes-validate). An object of a kind it has no validator for is an error, never
// skipped: nothing leaves CI unvalidated.
//
// Prints one JSON line on stdout: {"validated": {"apiVersion/kind": count}, "errors": n};
// each error is a line on stderr: FILE: KIND/NAME: where: what. Exit 1 on any error.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as monitoringV1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as monitoringV1alpha1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1";

// "apiVersion/kind" -> the model class, from every class the packages export.
const models = new Map();
for (const namespace of [keda, monitoringV1, monitoringV1alpha1]) {
  for (const model of Object.values(namespace)) {
    if (typeof model === "function" && model.apiVersion && model.kind) {
      models.set(`${model.apiVersion}/${model.kind}`, model);
    }
  }
}

const validated = {};
let errors = 0;
const fail = (file, object, message) => {
  errors += 1;
  const name = object?.metadata?.name ?? "(no name)";
  console.error(`${file}: ${object?.kind ?? "(no kind)"}/${name}: ${message}`);
};

for (const file of process.argv.slice(2)) {
  for (const document of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (document.errors.length) {
      fail(file, null, `not YAML: ${document.errors[0].message}`);
      continue;
    }
    const object = document.toJS();
    if (object === null || object === undefined) continue;
    const key = `${object.apiVersion}/${object.kind}`;
    const Model = models.get(key);
    if (!Model) {
      fail(file, object, `no schema for ${key}: no validator checks it (add one to crds.mjs)`);
      continue;
    }
    try {
      new Model(object).validate();
      validated[key] = (validated[key] ?? 0) + 1;
    } catch (error) {
      // ajv's message: "data/spec/... must ..."; one line per failed keyword.
      for (const line of String(error.message).split("\n")) fail(file, object, line);
    }
  }
}

console.log(JSON.stringify({ validated, errors }));
process.exit(errors ? 1 : 0);
