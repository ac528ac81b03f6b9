"""The Pod Security Standard "restricted" (Kubernetes 1.30), checked on every pod template:
what the namespace's Pod Security Admission label enforces at admission (namespace/), so
that CI refuses what the cluster would. checkov's checks overlap but differ: its "root
containers" check accepts runAsNonRoot: false beside a non-zero runAsUser, which
"restricted" refuses.

The controls (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
baseline's host namespaces, privileged, added capabilities, hostPath, host ports, /proc
mount, sysctls and seccomp; restricted's volume types, allowPrivilegeEscalation: false,
runAsNonRoot: true, runAsUser not 0, seccomp RuntimeDefault or Localhost, capabilities
dropping ALL and adding at most NET_BIND_SERVICE.
"""

from __future__ import annotations

from collections.abc import Iterator

from kcheck.manifests import Obj, containers, ident, workloads

ALLOWED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)


def _pod_level(spec: Obj) -> Iterator[str]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"{field} must not be true"
    for volume in spec.get("volumes") or []:
        kind = next((k for k in volume if k != "name"), "?")
        if kind not in ALLOWED_VOLUMES:
            yield f"volume {volume.get('name')} of type {kind} is not allowed"
    pod = spec.get("securityContext") or {}
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"sysctl {sysctl.get('name')} is not allowed"
    if pod.get("runAsUser") == 0:
        yield "runAsUser must not be 0"


def _identity(pod: Obj, own: Obj) -> Iterator[str]:
    """Who the container runs as, and what it may become."""
    if own.get("privileged"):
        yield "privileged must not be true"
    if own.get("allowPrivilegeEscalation") is not False:
        yield "allowPrivilegeEscalation must be false"
    if own.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
        yield "runAsNonRoot must be true (pod or container)"
    if own.get("runAsUser") == 0:
        yield "runAsUser must not be 0"
    seccomp = (own.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_ALLOWED:
        yield f"seccompProfile.type must be RuntimeDefault or Localhost, is {seccomp}"
    if own.get("procMount", "Default") != "Default":
        yield "procMount must be Default"


def _reach(container: Obj, own: Obj) -> Iterator[str]:
    """Its capabilities and host ports."""
    capabilities = own.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        yield "capabilities must drop ALL"
    added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
    if added:
        yield f"capabilities added: {', '.join(sorted(added))}"
    for port in container.get("ports") or []:
        if port.get("hostPort"):
            yield f"hostPort {port['hostPort']} is not allowed"


def _container_level(spec: Obj, container: Obj) -> Iterator[str]:
    pod = spec.get("securityContext") or {}
    own = container.get("securityContext") or {}
    yield from _identity(pod, own)
    yield from _reach(container, own)


def violations(objects: list[Obj]) -> Iterator[str]:
    """One line per control a pod template breaks."""
    for obj, template in workloads(objects):
        spec = template.get("spec") or {}
        for problem in _pod_level(spec):
            yield f"PSS restricted {ident(obj)}: {problem}"
        for container in containers(template):
            for problem in _container_level(spec, container):
                yield f"PSS restricted {ident(obj)} container {container.get('name')}: {problem}"
