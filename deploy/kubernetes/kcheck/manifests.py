"""Reading rendered manifests: YAML streams in, plain objects out, and the few ways into
them every check needs (the pod template, the containers, labels, selectors)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

Obj = dict[str, Any]

HERE = Path(__file__).resolve().parents[1]  # deploy/kubernetes
REPO = HERE.parents[1]

# The API groups Kubernetes serves itself: kubernetes-validate has their schemas. Any
# other group is a custom resource, for validate/crds.mjs.
CORE_GROUPS = frozenset(
    {
        "",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "apps",
        "autoscaling",
        "batch",
        "certificates.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "networking.k8s.io",
        "node.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
    }
)
# Where each workload kind keeps its pod template.
TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass
class Result:
    """What a check found: problems (one line each; none means it passed) and figures."""

    name: str
    problems: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the check passed."""
        return not self.problems


def load_stream(path: Path) -> list[Obj]:
    """The objects of a YAML stream (empty documents left out)."""
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in YAML(typ="safe").load_all(stream) if isinstance(doc, dict)]


def dump_stream(objects: Iterable[Obj]) -> str:
    """A YAML stream of ``objects``."""
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump_all(list(objects), out)
    return out.getvalue()


def group_of(obj: Obj) -> str:
    """The API group of an object ('' for the core group)."""
    api_version = str(obj.get("apiVersion", ""))
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def is_core(obj: Obj) -> bool:
    """Whether Kubernetes serves this kind itself (else it is a custom resource)."""
    return group_of(obj) in CORE_GROUPS


def ident(obj: Obj) -> str:
    """Kind/name, for messages."""
    return f"{obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"


def digest(obj: Obj) -> str:
    """A stable digest of an object's content (to validate each distinct object once)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]..., or None where a key is missing."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def pod_template(obj: Obj) -> Obj | None:
    """The pod template of a workload (None for other kinds)."""
    path = TEMPLATE_PATHS.get(str(obj.get("kind")))
    template = dig(obj, *path) if path else None
    return template if isinstance(template, dict) else None


def containers(template: Obj) -> Iterator[Obj]:
    """Every container of a pod template, init containers included."""
    spec = template.get("spec") or {}
    for key in ("initContainers", "containers"):
        yield from spec.get(key) or []


def workloads(objects: Iterable[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, its pod template) for every object that has one."""
    for obj in objects:
        template = pod_template(obj)
        if template is not None:
            yield obj, template


def labels_of(template: Obj) -> dict[str, str]:
    """A pod template's labels."""
    return dict(dig(template, "metadata", "labels") or {})


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects these labels."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        if not _matches(expression, labels):
            return False
    return True


def _matches(expression: Obj, labels: dict[str, str]) -> bool:
    """One matchExpressions entry against the labels."""
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist


def env_of(container: Obj) -> dict[str, Obj]:
    """A container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env") or []}


def config_maps(objects: Iterable[Obj]) -> dict[str, dict[str, str]]:
    """The data of every ConfigMap, by name."""
    return {
        str(obj["metadata"]["name"]): {k: str(v) for k, v in (obj.get("data") or {}).items()}
        for obj in objects
        if obj.get("kind") == "ConfigMap"
    }


def plain_env(container: Obj, maps: dict[str, dict[str, str]]) -> dict[str, str]:
    """The variables with literal values: its ConfigMaps' (envFrom), then its own ``value``s
    (which win, as in Kubernetes). Secret references are not included."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        name = dig(source, "configMapRef", "name")
        if name is not None:
            prefix = str(source.get("prefix", ""))
            env.update({prefix + k: v for k, v in maps.get(str(name), {}).items()})
    for entry in container.get("env") or []:
        if "value" in entry:
            env[str(entry["name"])] = str(entry["value"])
    return env
