"""deploy/kubernetes, offline: every rendering passes every check, and each check catches
a field broken on purpose in a real rendered object.

Every test runs deploy/kubernetes/check.py (or generate.py), the code .ci/kubernetes-checks
runs: there is no second copy of a check here. They need kubectl, the tool venvs and
validate/node_modules, which .ci/kubernetes-checks installs; without them they skip
(under CI=true they fail).
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.deploy.kube import TREE, Obj, Rendered, check, failures, find, run, the

pytestmark = pytest.mark.kubernetes


def test_every_rendering_passes_every_check(tools: None, tmp_path: Path) -> None:
    """Both profiles, in every combination of their Components, and large-pooler pass every
    check."""
    done = run("check.py", "all", "--out", tmp_path)
    print(done.stdout)  # every check's report: the record of a CI run (-s)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    assert "every check passed" in done.stdout
    assert done.stdout.count("(shipped)") == 3


def test_generated_files_are_current_and_a_stale_one_is_named(tmp_path: Path) -> None:
    """generate.py --check passes on the tree and names a generated file edited by hand."""
    assert run("generate.py", "--check").returncode == 0
    for folder in ("components/monitoring", "components/monitoring-scan-cron"):
        shutil.copytree(TREE / folder, tmp_path / folder)
    rule = tmp_path / "components/monitoring/prometheusrule.yaml"
    rule.write_text(rule.read_text().replace("for: 1m", "for: 2m", 1))
    done = run("generate.py", "--check", "--tree", tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "components/monitoring/prometheusrule.yaml" in done.stderr


def _replicas_as_text(deployment: Obj) -> None:
    deployment["spec"]["replicas"] = "two"


def _unknown_field(deployment: Obj) -> None:
    deployment["spec"]["strategy"]["rollingUpdate"]["maxSurgee"] = 1


@pytest.mark.parametrize(
    ("breaks", "named"),
    [
        (_replicas_as_text, "spec.replicas: 'two' is not of type 'integer'"),
        (_unknown_field, "'maxSurgee' was unexpected"),
    ],
)
def test_schema_check_rejects_a_mistyped_or_unknown_field(
    rendered: Rendered, tmp_path: Path, breaks: Callable[[Obj], None], named: str
) -> None:
    """A Deployment with a field of the wrong type, or one Kubernetes does not know, fails
    the strict schema check."""
    deployment = find(rendered["small"], "Deployment", "expiry-consumer")
    breaks(deployment)
    done = check("schemas", tmp_path, [deployment])
    assert done.returncode == 1
    assert named in failures(done)


def _custom_objects(rendered: Rendered) -> Iterator[tuple[str, Obj, str]]:
    """(what is broken, the broken object, what the check must say)."""
    scaled = find(rendered["small"], "ScaledObject", "expiry-consumer")
    del scaled["spec"]["scaleTargetRef"]
    yield "no scaleTargetRef", scaled, "must have required property scaleTargetRef"
    scaled = find(rendered["small"], "ScaledObject", "expiry-consumer")
    scaled["spec"]["triggers"][0]["metadata"]["value"] = 2000
    yield "trigger value a number", scaled, "metadata/value must be string"
    rule = find(rendered["large"], "PrometheusRule", "expiry-service")
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    yield "rule without expr", rule, "rules/0 must have required property expr"
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    yield "a kind without validator", widget, "no schema for example.com/v1/Widget"


def test_crd_check_rejects_broken_custom_resources(rendered: Rendered, tmp_path: Path) -> None:
    """A ScaledObject without its target or with a trigger value of the wrong type, a
    PrometheusRule rule without `expr`, and a custom kind nothing validates all fail."""
    for what, obj, named in _custom_objects(rendered):
        done = check("crds", tmp_path, [obj])
        assert done.returncode == 1, what
        assert named in failures(done), (what, done.stdout)


def _pod_security_breaks() -> dict[str, tuple[Callable[[Obj, Obj], None], str]]:
    """name: (how the pod (spec, container) is broken, the failure that must be reported:
    checkov's check, or the Pod Security Standard restricted's control)."""

    def root(spec: Obj, container: Obj) -> None:
        spec["securityContext"]["runAsNonRoot"] = False
        container["securityContext"]["runAsNonRoot"] = False

    def uid0(spec: Obj, container: Obj) -> None:
        spec["securityContext"]["runAsUser"] = 0
        container["securityContext"]["runAsUser"] = 0

    def writable(_spec: Obj, container: Obj) -> None:
        del container["securityContext"]["readOnlyRootFilesystem"]

    def capable(_spec: Obj, container: Obj) -> None:
        container["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}

    def unconfined(spec: Obj, _container: Obj) -> None:
        del spec["securityContext"]["seccompProfile"]

    def escalating(_spec: Obj, container: Obj) -> None:
        container["securityContext"]["allowPrivilegeEscalation"] = True

    return {
        "broken-root": (
            root,
            "PSS restricted Deployment/broken-root container consumer: runAsNonRoot",
        ),
        "broken-uid0": (uid0, "CKV_K8S_40 Deployment.expiry.broken-uid0"),
        "broken-writable": (writable, "CKV_K8S_22 Deployment.expiry.broken-writable"),
        "broken-capable": (capable, "CKV_K8S_25 Deployment.expiry.broken-capable"),
        "broken-unconfined": (unconfined, "CKV_K8S_31 Deployment.expiry.broken-unconfined"),
        "broken-escalating": (escalating, "CKV_K8S_20 Deployment.expiry.broken-escalating"),
    }


def test_policy_check_rejects_each_pod_security_break(rendered: Rendered, tmp_path: Path) -> None:
    """A consumer that may run as root or runs as uid 0, writes its root filesystem, adds a
    capability, runs without seccomp or may escalate fails the policy check; the shipped one,
    beside them under the same network policies, passes."""
    shipped = find(rendered["small"], "Deployment", "expiry-consumer")
    policies = [o for o in rendered["small"] if o.get("kind") == "NetworkPolicy"]
    objects = [*policies, shipped]
    for name, (breaks, _) in _pod_security_breaks().items():
        broken = copy.deepcopy(shipped)
        broken["metadata"]["name"] = name
        spec = broken["spec"]["template"]["spec"]
        breaks(spec, spec["containers"][0])
        objects.append(broken)
    done = check("policy", tmp_path, objects)
    assert done.returncode == 1
    found = failures(done)
    for name, (_, named) in _pod_security_breaks().items():
        assert named in found, (name, found)
    assert "expiry-consumer" not in found, found


def test_rules_check_rejects_a_rule_that_differs_from_alerts_yml(
    rendered: Rendered, tmp_path: Path
) -> None:
    """A PrometheusRule with a changed expression, or without one of alerts.yml's rules,
    fails; so does a cron rendering that keeps the timer scanner's absence alert."""
    rule = find(rendered["large"], "PrometheusRule", "expiry-service")
    rules = rule["spec"]["groups"][0]["rules"]
    rules[0]["expr"] += " * 2"
    done = check("rules", tmp_path, [rule])
    assert "ExpiryOldestDueHoldOverObjective: `expr` differs from alerts.yml" in failures(done)
    del rules[1]
    done = check("rules", tmp_path, [rule])
    assert "rule ExpiryDeadLettersGrowing is missing" in failures(done)
    every = find(rendered["large"], "PrometheusRule", "expiry-service")
    cron = find(rendered["small"], "CronJob", "expiry-scan")
    done = check("rules", tmp_path, [every, cron])
    assert done.returncode == 1
    assert "ExpiryScannerAbsent must be dropped" in failures(done)


def test_commands_check_rejects_what_the_image_cannot_run(
    rendered: Rendered, tmp_path: Path
) -> None:
    """A module the image lacks, an option its parser refuses, and a misspelt setting fail."""
    small = rendered["small"]
    nosuch = find(small, "Deployment", "expiry-consumer")
    nosuch["spec"]["template"]["spec"]["containers"][0]["command"][2] = "service.nosuch"
    assert "not `python -m service.<module>`" in failures(check("commands", tmp_path, [nosuch]))
    scanner = find(rendered["large"], "Deployment", "expiry-scanner")
    scanner["spec"]["template"]["spec"]["containers"][0]["command"][3] = "--evry"
    assert "--evry 5` refused: " in failures(check("commands", tmp_path, [scanner]))
    typo = find(small, "Deployment", "expiry-consumer")
    env = typo["spec"]["template"]["spec"]["containers"][0]["env"]
    env.append({"name": "EXPIRY_PREFECH", "value": "100"})
    found = failures(check("commands", tmp_path, [typo]))
    assert "settings refused" in found
    assert "EXPIRY_PREFECH" in found


def test_consistency_check_rejects_broken_cross_object_rules(
    rendered: Rendered, tmp_path: Path
) -> None:
    """Two autoscalers on the consumers, scaling to zero, counting the retry queues by
    regex, a grace period shorter than the drain (or than the relay's batch in hand) and a
    scan interval that lies all fail."""
    small, large = rendered["small"], rendered["large"]
    hpa = next(objs for name, objs in rendered.items() if "-cpu-" in name)
    both = [*small, find(hpa, "HorizontalPodAutoscaler", "expiry-consumer")]
    assert "has 2 autoscalers" in failures(check("consistency", tmp_path, both))
    broken = copy.deepcopy(small)
    scaled = find(broken, "ScaledObject", "expiry-consumer")
    broken.remove(the(broken, "ScaledObject", "expiry-consumer"))
    scaled["spec"]["minReplicaCount"] = 0
    meta = scaled["spec"]["triggers"][0]["metadata"]
    meta.update(queueName="^expirations.*$", useRegex="true")
    consumer = the(broken, "Deployment", "expiry-consumer")
    consumer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    relay = the(broken, "Deployment", "expiry-relay")
    relay["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    found = failures(check("consistency", tmp_path, [*broken, scaled]))
    assert "never scale to zero" in found
    assert "queueName must be 'expirations'" in found
    assert "useRegex must be false" in found
    assert "terminationGracePeriodSeconds 30 < EXPIRY_SHUTDOWN_TIMEOUT_SECONDS 30 + 20" in found
    assert "expiry-relay: terminationGracePeriodSeconds 30 < EXPIRY_PUBLISH_TIMEOUT" in found
    lying = copy.deepcopy(large)
    scanner = the(lying, "Deployment", "expiry-scanner")
    scanner["spec"]["template"]["spec"]["containers"][0]["command"][4] = "10"
    assert "it runs every 10.0 s" in failures(check("consistency", tmp_path, lying))


def test_argocd_application_kustomization_renders(tools: None) -> None:
    """The Argo CD kustomization the docs give (a profile and the setup Jobs in one
    Application) renders, its Jobs reading the profile's settings ConfigMap."""
    directory = TREE / ".cache" / f"argocd-{os.getpid()}"  # two levels down, as overlays/x
    directory.mkdir(parents=True, exist_ok=True)
    try:
        (directory / "kustomization.yaml").write_text(
            "namespace: expiry\n"
            "resources: [../../overlays/small, ../../setup]\n"
            "components: [../../components/image]\n"
        )
        done = run("check.py", "kustomize", directory)
    finally:
        shutil.rmtree(directory)
    assert done.returncode == 0, done.stderr
    objects = [d for d in YAML(typ="safe").load_all(done.stdout) if d]
    settings = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and "expiry-settings" in o["metadata"]["name"]
    )
    assert settings["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "-2"
    for job in ("expiry-migrate", "expiry-declare"):
        found = the(objects, "Job", job)
        assert found["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "Sync"
        container = found["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"][0]["configMapRef"]["name"] == settings["metadata"]["name"]
        assert container["image"].startswith("registry.example.com/")
