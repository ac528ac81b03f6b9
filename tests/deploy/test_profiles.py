"""deploy/kubernetes, offline: what the opt-in profiles and Components render, and the
consistency check catching them broken: large-pooler (32 consumers behind a transaction
pooler) and components/tls (the Secret expiry-tls in every workload and setup Job)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.deploy.kube import Obj, Rendered, check, failures, settings_map, settings_of, the

pytestmark = pytest.mark.kubernetes


def test_large_pooler_renders_32_consumers_behind_the_pooler(rendered: Rendered) -> None:
    """large-pooler is large with KEDA's (or the CPU HPA's) maximum at 32, every workload
    told of the transaction pooler, egress to its port, and the relay's direct URL; large
    itself keeps its 8 and no pooler."""
    pooled, large = rendered["large-pooler"], rendered["large"]
    scaled = the(pooled, "ScaledObject", "expiry-consumer")["spec"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (3, 32)
    assert the(large, "ScaledObject", "expiry-consumer")["spec"]["maxReplicaCount"] == 8
    on_cpu = next(o for name, o in rendered.items() if "large-pooler-on-large-cpu-" in name)
    assert the(on_cpu, "HorizontalPodAutoscaler", "expiry-consumer")["spec"]["maxReplicas"] == 32
    settings = settings_of(pooled)
    assert settings["EXPIRY_DB_POOLER"] == "transaction"
    assert "EXPIRY_DB_POOLER" not in settings_of(large)
    assert {k: v for k, v in settings.items() if k != "EXPIRY_DB_POOLER"} == settings_of(large)
    policy = the(pooled, "NetworkPolicy", "expiry-egress-pooler")["spec"]
    assert policy["egress"] == [{"ports": [{"protocol": "TCP", "port": 6432}]}]
    reached = set(policy["podSelector"]["matchExpressions"][1]["values"])
    assert reached == {"consumer", "scanner", "scan", "relay", "deliver", "console"}
    relay = the(pooled, "Deployment", "expiry-relay")["spec"]["template"]["spec"]
    session = next(e for e in relay["containers"][0]["env"] if e["name"] == "EXPIRY_DB_SESSION_URL")
    assert session["valueFrom"]["secretKeyRef"] == {
        "name": "expiry-relay",
        "key": "EXPIRY_DB_SESSION_URL",
        "optional": True,
    }


def test_consistency_check_rejects_a_fleet_past_the_connections(
    rendered: Rendered, tmp_path: Path
) -> None:
    """large-pooler without EXPIRY_DB_POOLER would ask PostgreSQL for 320 connections, and
    its relay without EXPIRY_DB_SESSION_URL would only poll: both fail."""
    unpooled = copy.deepcopy(rendered["large-pooler"])
    del settings_map(unpooled)["data"]["EXPIRY_DB_POOLER"]
    found = failures(check("consistency", tmp_path, unpooled))
    assert "ScaledObject/expiry-consumer: up to 32 consumers x EXPIRY_DB_POOL_SIZE 10" in found
    assert "= 320 PostgreSQL connections, over 80" in found
    deaf = copy.deepcopy(rendered["large-pooler"])
    container = the(deaf, "Deployment", "expiry-relay")["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "EXPIRY_DB_SESSION_URL"]
    found = failures(check("consistency", tmp_path, deaf))
    assert "Deployment/expiry-relay: EXPIRY_DB_POOLER=transaction without" in found
    assert "PostgreSQL connections" not in found


def _mounts(objects: list[Obj]) -> dict[str, tuple[list[str], list[str]]]:
    """Each workload's volumes from Secrets, and its container's mount paths."""
    found = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind not in ("Deployment", "CronJob", "Job"):
            continue
        spec = obj["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else obj["spec"]
        pod = spec["template"]["spec"]
        secrets = [v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v]
        paths = [m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])]
        found[obj["metadata"]["name"]] = (secrets, paths)
    return found


def test_tls_mounts_its_secret_in_every_workload_and_setup_job(rendered: Rendered) -> None:
    """components/tls: the Secret expiry-tls read-only at /etc/expiry/tls in each
    Deployment and CronJob of a profile (the deliverer keeps its own mount too) and in the
    setup's Jobs; the shipped profiles mount nothing of it."""
    with_tls = [o for name, o in rendered.items() if "-webhooks-tls-" in name]
    setups = [o for o in rendered.values() if any(x.get("kind") == "Job" for x in o)]
    tls_setups = [o for o in setups if any("expiry-tls" in s for s, _ in _mounts(o).values())]
    assert len(with_tls) == 2  # small and large
    assert len(tls_setups) == 2
    for objects in with_tls + tls_setups:
        for name, (secrets, paths) in _mounts(objects).items():
            assert "expiry-tls" in secrets, name
            assert "/etc/expiry/tls" in paths, name
    deliver = _mounts(with_tls[0])["expiry-deliver"]
    assert deliver == (
        ["expiry-tls", "expiry-webhooks"],
        ["/etc/expiry/tls", "/etc/expiry/webhooks"],
    )
    assert set(_mounts(tls_setups[0])) == {"expiry-migrate", "expiry-declare"}
    for shipped in ("small", "large"):
        assert all("expiry-tls" not in s for s, _ in _mounts(rendered[shipped]).values())
    volume = the(with_tls[0], "Deployment", "expiry-consumer")["spec"]["template"]["spec"]
    assert volume["volumes"][0]["secret"]["defaultMode"] == 0o444
