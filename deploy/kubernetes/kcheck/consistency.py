"""What no schema knows: the rules these manifests keep across objects, per rendering.

- one autoscaler per Deployment (KEDA's ScaledObject or an HPA, never both), never to 0;
  KEDA on the management API, exactly the queue `expirations`, the unacked counted;
- each workload its own ServiceAccount, that exists, with no token mounted;
- each pod labelled for the network policies, and selected by the default deny;
- the consumers' grace period covers their drain (EXPIRY_SHUTDOWN_TIMEOUT_SECONDS + 20 s),
  the relay's its batch in hand (the publish timeout + the statement timeout + 20 s), the
  webhook deliverer's its POSTs in flight (an endpoint's default timeout + the statement
  timeout + 20 s);
- EXPIRY_SCAN_INTERVAL_SECONDS is the interval the scan really runs at;
- every image went through components/image (a registry, a tag or digest);
- Secrets referenced (as variables or mounted as files), never inline, and each one
  documented in secrets.example.yaml;
- every namespaced object in the namespace of namespace/namespace.yaml;
- PostgreSQL's connections (kcheck/connections.py): the consumers' autoscaler maximum x
  EXPIRY_DB_POOL_SIZE within what the server allows unless through a transaction pooler,
  and a relay behind one given a direct URL to LISTEN on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from kcheck.connections import db_connections, relay_session
from kcheck.manifests import (
    HERE,
    Obj,
    Result,
    config_maps,
    containers,
    dig,
    ident,
    labels_of,
    load_stream,
    plain_env,
    selects,
    workloads,
)

PART_OF = ("app.kubernetes.io/part-of", "expiry-service")
GRACE_MARGIN_SECONDS = 20  # span export at shutdown (15) + closing (5): base/consumer.yaml
PREFETCH_DEFAULT = 400
# An endpoint's timeout_seconds when it sets none (service/settings/endpoints.py).
WEBHOOK_TIMEOUT_DEFAULT = 10.0
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
SECRET_NAMES = ("DATABASE_URL", "AMQP_URL", "EXPIRY_MANAGEMENT_URL", "EXPIRY_CONSOLE_SECRET")
CRON_EVERY_MINUTES = re.compile(r"^(?:\*|\*/(\d+)) \* \* \* \*$")
IMAGE_PINNED = re.compile(r"(:\w[\w.-]*|@sha256:[0-9a-f]{64})$")


def _namespace() -> str:
    return str(YAML(typ="safe").load(HERE / "namespace" / "namespace.yaml")["metadata"]["name"])


def documented_secrets() -> dict[str, set[str]]:
    """secrets.example.yaml's Secrets and keys (a commented-out key counts: it is optional)."""
    found: dict[str, set[str]] = {}
    for part in (HERE / "secrets.example.yaml").read_text(encoding="utf-8").split("\n---"):
        doc = YAML(typ="safe").load(part) or {}
        keys = set((doc.get("stringData") or {}) | (doc.get("data") or {}))
        keys |= set(re.findall(r"^\s*#\s*([A-Za-z_][A-Za-z0-9_]*):", part, flags=re.M))
        found[str(dig(doc, "metadata", "name"))] = keys
    return found


def _autoscalers(objects: list[Obj], problems: list[str]) -> None:
    targets: dict[str, list[str]] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind == "HorizontalPodAutoscaler":
            targets.setdefault(str(dig(obj, "spec", "scaleTargetRef", "name")), []).append(
                ident(obj)
            )
            if (dig(obj, "spec", "minReplicas") or 1) < 1:
                problems.append(f"{ident(obj)}: minReplicas under 1")
        if kind == "ScaledObject":
            targets.setdefault(str(dig(obj, "spec", "scaleTargetRef", "name")), []).append(
                ident(obj)
            )
            _keda(obj, objects, problems)
    for target, scalers in targets.items():
        if len(scalers) > 1:
            problems.append(
                f"Deployment/{target} has {len(scalers)} autoscalers: {', '.join(scalers)}"
            )
    consumer = any(
        o.get("kind") == "Deployment" and dig(o, "metadata", "name") == "expiry-consumer"
        for o in objects
    )
    if consumer and "expiry-consumer" not in targets:
        problems.append("Deployment/expiry-consumer has no autoscaler (components/autoscale-*)")


def _keda(obj: Obj, objects: list[Obj], problems: list[str]) -> None:
    where = ident(obj)
    if (
        not isinstance(dig(obj, "spec", "minReplicaCount"), int)
        or obj["spec"]["minReplicaCount"] < 1
    ):
        problems.append(f"{where}: minReplicaCount must be 1 or more (never scale to zero)")
    auths = {
        dig(o, "metadata", "name") for o in objects if o.get("kind") == "TriggerAuthentication"
    }
    for trigger in dig(obj, "spec", "triggers") or []:
        meta: dict[str, Any] = trigger.get("metadata") or {}
        wanted = {"protocol": "http", "mode": "QueueLength", "queueName": "expirations"}
        for key, value in wanted.items():
            if meta.get(key) != value:
                problems.append(f"{where}: trigger {key} must be {value!r}, is {meta.get(key)!r}")
        for flag in ("useRegex", "excludeUnacknowledged"):
            if str(meta.get(flag, "false")).lower() != "false":
                problems.append(f"{where}: trigger {flag} must be false")
        if any(k in meta for k in ("host", "hostFromEnv", "password", "username")):
            problems.append(f"{where}: trigger credentials inline: use its TriggerAuthentication")
        if dig(trigger, "authenticationRef", "name") not in auths:
            problems.append(f"{where}: its authenticationRef names no TriggerAuthentication here")
        target, prefetch = float(meta.get("value", "0") or 0), _prefetch(objects, obj)
        if target <= 2 * prefetch:
            problems.append(
                f"{where}: value {target:g} is not above 2 x EXPIRY_PREFETCH ({prefetch:g}): the "
                "deliveries busy consumers hold would ask for more consumers by themselves"
            )


def _prefetch(objects: list[Obj], scaled: Obj) -> float:
    """EXPIRY_PREFETCH of the consumers a ScaledObject scales (the default if unset)."""
    target = dig(scaled, "spec", "scaleTargetRef", "name")
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        if obj.get("kind") == "Deployment" and dig(obj, "metadata", "name") == target:
            for container in containers(template):
                return float(plain_env(container, maps).get("EXPIRY_PREFETCH", PREFETCH_DEFAULT))
    return float(PREFETCH_DEFAULT)


def _pods(objects: list[Obj], problems: list[str]) -> None:
    accounts = {dig(o, "metadata", "name") for o in objects if o.get("kind") == "ServiceAccount"}
    deny = [
        o
        for o in objects
        if o.get("kind") == "NetworkPolicy"
        and not dig(o, "spec", "ingress")
        and not dig(o, "spec", "egress")
        and set(dig(o, "spec", "policyTypes") or []) == {"Ingress", "Egress"}
    ]
    users: dict[str, str] = {}
    for obj, template in workloads(objects):
        where, spec = ident(obj), template.get("spec") or {}
        account = spec.get("serviceAccountName")
        if account not in accounts:
            problems.append(f"{where}: its ServiceAccount {account!r} is not in the rendering")
        elif account in users:
            problems.append(f"{where}: shares ServiceAccount {account} with {users[account]}")
        users[str(account)] = where
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: automountServiceAccountToken must be false")
        labels = labels_of(template)
        if labels.get(PART_OF[0]) != PART_OF[1]:
            problems.append(f"{where}: pods lack {PART_OF[0]}={PART_OF[1]} (the network policies)")
        if deny and not any(selects(dig(p, "spec", "podSelector"), labels) for p in deny):
            problems.append(f"{where}: no default-deny NetworkPolicy selects its pods")


def _grace(objects: list[Obj], problems: list[str]) -> None:
    """The consumers' grace period covers the drain and the shutdown after it."""
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        for container in containers(template):
            if "service.consume" not in [str(a) for a in container.get("command") or []]:
                continue
            drain = float(plain_env(container, maps).get("EXPIRY_SHUTDOWN_TIMEOUT_SECONDS", "30"))
            grace = dig(template, "spec", "terminationGracePeriodSeconds") or 30
            if grace < drain + GRACE_MARGIN_SECONDS:
                problems.append(
                    f"{ident(obj)}: terminationGracePeriodSeconds {grace} < "
                    f"EXPIRY_SHUTDOWN_TIMEOUT_SECONDS {drain:g} + {GRACE_MARGIN_SECONDS}"
                )


def _relay_grace(objects: list[Obj], problems: list[str]) -> None:
    """The relay's grace period covers the batch in hand (its confirms, then its mark) and
    the shutdown after it."""
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        for container in containers(template):
            if "service.relay" not in [str(a) for a in container.get("command") or []]:
                continue
            env = plain_env(container, maps)
            publish = float(env.get("EXPIRY_PUBLISH_TIMEOUT_SECONDS", "10"))
            mark = float(env.get("EXPIRY_STATEMENT_TIMEOUT_MS", "10000")) / 1000
            grace = dig(template, "spec", "terminationGracePeriodSeconds") or 30
            if grace < publish + mark + GRACE_MARGIN_SECONDS:
                problems.append(
                    f"{ident(obj)}: terminationGracePeriodSeconds {grace} < "
                    f"EXPIRY_PUBLISH_TIMEOUT_SECONDS {publish:g} + EXPIRY_STATEMENT_TIMEOUT_MS "
                    f"{mark:g} s + {GRACE_MARGIN_SECONDS}"
                )


def _deliver_grace(objects: list[Obj], problems: list[str]) -> None:
    """The webhook deliverer's grace period covers the POSTs in flight (an endpoint's
    timeout, the default one: the endpoints live in a Secret), their settling and the
    shutdown after it."""
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        for container in containers(template):
            if "service.deliver" not in [str(a) for a in container.get("command") or []]:
                continue
            settle = float(plain_env(container, maps).get("EXPIRY_STATEMENT_TIMEOUT_MS", "10000"))
            grace = dig(template, "spec", "terminationGracePeriodSeconds") or 30
            if grace < WEBHOOK_TIMEOUT_DEFAULT + settle / 1000 + GRACE_MARGIN_SECONDS:
                problems.append(
                    f"{ident(obj)}: terminationGracePeriodSeconds {grace} < an endpoint's "
                    f"timeout_seconds {WEBHOOK_TIMEOUT_DEFAULT:g} + EXPIRY_STATEMENT_TIMEOUT_MS "
                    f"{settle / 1000:g} s + {GRACE_MARGIN_SECONDS}"
                )


def _runs_every(obj: Obj, argv: list[str]) -> float | None:
    """How often a scan container runs: its --every, or its CronJob's minutes."""
    if "--every" in argv:
        return float(argv[argv.index("--every") + 1])
    match = CRON_EVERY_MINUTES.match(str(dig(obj, "spec", "schedule") or ""))
    return 60.0 * int(match.group(1) or 1) if match else None


def _interval(objects: list[Obj], problems: list[str]) -> None:
    """EXPIRY_SCAN_INTERVAL_SECONDS is the interval the scan runs at."""
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        for container in containers(template):
            argv = [str(a) for a in container.get("command") or []]
            if "service.produce" not in argv:
                continue
            said = plain_env(container, maps).get("EXPIRY_SCAN_INTERVAL_SECONDS")
            runs = _runs_every(obj, argv)
            if runs is None or said is None or float(said) != runs:
                problems.append(
                    f"{ident(obj)}: EXPIRY_SCAN_INTERVAL_SECONDS is {said}; it runs every {runs} s"
                )


def _images(objects: list[Obj], problems: list[str]) -> None:
    """Every image went through components/image: a registry, and a tag or a digest."""
    for obj, template in workloads(objects):
        for container in containers(template):
            image = str(container.get("image", ""))
            if "/" not in image or not IMAGE_PINNED.search(image):
                problems.append(
                    f"{ident(obj)} container {container.get('name')}: image {image!r} has no "
                    "registry and tag (is components/image listed last?)"
                )


def _env_references(objects: list[Obj], problems: list[str]) -> list[tuple[str, Any, Any]]:
    """(where, Secret, key) of every container's secretKeyRef; a secret given inline is a
    problem."""
    references: list[tuple[str, Any, Any]] = []
    for obj, template in workloads(objects):
        for container in containers(template):
            where = f"{ident(obj)} container {container.get('name')}"
            for entry in container.get("env") or []:
                ref = dig(entry, "valueFrom", "secretKeyRef")
                if ref:
                    references.append((where, ref.get("name"), ref.get("key")))
                elif entry["name"] in SECRET_NAMES or "@" in str(entry.get("value", "")):
                    problems.append(f"{where}: {entry['name']} given inline: reference a Secret")
    return references


def _volume_references(objects: list[Obj]) -> list[tuple[str, Any, Any]]:
    """(where, Secret, key) of every Secret volume's file (its ``items``; one without items
    mounts every key, and its key is None: the Secret must be documented)."""
    references: list[tuple[str, Any, Any]] = []
    for obj, template in workloads(objects):
        for volume in dig(template, "spec", "volumes") or []:
            secret = volume.get("secret")
            if not isinstance(secret, dict) or secret.get("optional", False):
                continue
            where = f"{ident(obj)} volume {volume.get('name')}"
            items = secret.get("items") or [{"key": None}]
            references += [(where, secret.get("secretName"), item["key"]) for item in items]
    return references


def _secrets(objects: list[Obj], problems: list[str]) -> None:
    """Secrets referenced, never inline, each documented in secrets.example.yaml."""
    documented = documented_secrets()
    references = _env_references(objects, problems) + _volume_references(objects)
    for obj in objects:
        if obj.get("kind") == "Secret":
            problems.append(f"{ident(obj)}: a Secret in the manifests: reference yours instead")
        for ref in dig(obj, "spec", "secretTargetRef") or []:
            references.append((ident(obj), ref.get("name"), ref.get("key")))
    for where, name, key in references:
        if key is None:
            if str(name) not in documented:
                problems.append(f"{where}: Secret {name} is not in secrets.example.yaml")
        elif key not in documented.get(str(name), set()):
            problems.append(f"{where}: Secret {name} key {key} is not in secrets.example.yaml")


def _namespaces(objects: list[Obj], problems: list[str]) -> None:
    expected = _namespace()
    for obj in objects:
        got = dig(obj, "metadata", "namespace")
        if obj.get("kind") in CLUSTER_SCOPED:
            if obj.get("kind") == "Namespace" and dig(obj, "metadata", "name") != expected:
                problems.append(f"{ident(obj)}: not {expected}")
        elif got != expected:
            problems.append(f"{ident(obj)}: in namespace {got!r}, not {expected!r} (namespace/)")


RULES: list[Callable[[list[Obj], list[str]], None]] = [
    _autoscalers,
    _pods,
    _grace,
    _relay_grace,
    _deliver_grace,
    _interval,
    _images,
    _secrets,
    _namespaces,
    db_connections,
    relay_session,
]


def check(files: list[Path]) -> Result:
    """Every rule over every file, each file on its own."""
    result = Result("consistency")
    objects_checked = 0
    for file in files:
        objects = load_stream(file)
        objects_checked += len(objects)
        problems: list[str] = []
        for rule in RULES:
            rule(objects, problems)
        result.problems += [f"{file.name}: {problem}" for problem in problems]
    names = ", ".join(rule.__name__.strip("_") for rule in RULES)
    result.figures.append(
        f"{len(RULES)} rules ({names}) over {objects_checked} objects in {len(files)} file(s)"
    )
    return result
