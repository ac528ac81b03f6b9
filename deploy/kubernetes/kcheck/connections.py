"""PostgreSQL's connections, per rendering (two rules of kcheck/consistency.py).

- the consumers' autoscaler maximum x their EXPIRY_DB_POOL_SIZE stays within
  DIRECT_BUDGET connections, unless they go through a transaction pooler
  (EXPIRY_DB_POOLER=transaction: components/pooler), where those are the pooler's clients;
- a relay told it goes through a transaction pooler references EXPIRY_DB_SESSION_URL (a
  direct URL for its LISTEN): without it, it only polls (relay.polling_only).

DIRECT_BUDGET: PostgreSQL's default max_connections (100) less what the rest of a profile
holds straight to the server, about 17 in `large` (two scanners' one each, two relays'
pools of two and their LISTEN, the console's four, retention's, and the 3 of
superuser_reserved_connections): 80, the 8 consumers x 10 of overlays/large. What the
pooler itself allows (its max_client_conn, its pools) is the pooler's configuration, not
the manifests': docs/deployment.md, "On Kubernetes", says what to set; nothing checks it.
"""

from __future__ import annotations

from kcheck.manifests import Obj, config_maps, containers, dig, env_of, ident, plain_env, workloads

DIRECT_BUDGET = 80
POOL_SIZE_DEFAULT = 10  # EXPIRY_DB_POOL_SIZE (service/settings/concerns.py)
KEDA_MAX_DEFAULT = 100  # a ScaledObject's maxReplicaCount when it sets none (KEDA's docs)
POOLED = "transaction"


def _maximum(scaler: Obj) -> int:
    """The most replicas an autoscaler (KEDA's ScaledObject or an HPA) may run."""
    if scaler.get("kind") == "ScaledObject":
        return int(dig(scaler, "spec", "maxReplicaCount") or KEDA_MAX_DEFAULT)
    return int(dig(scaler, "spec", "maxReplicas") or 0)


def _runs(container: Obj, module: str) -> bool:
    return module in [str(a) for a in container.get("command") or []]


def db_connections(objects: list[Obj], problems: list[str]) -> None:
    """The consumers' most connections fit PostgreSQL's, or go through a pooler."""
    maps = config_maps(objects)
    consumers = {
        str(dig(obj, "metadata", "name")): [
            plain_env(c, maps) for c in containers(template) if _runs(c, "service.consume")
        ]
        for obj, template in workloads(objects)
        if obj.get("kind") == "Deployment"
    }
    for scaler in objects:
        if scaler.get("kind") not in ("ScaledObject", "HorizontalPodAutoscaler"):
            continue
        most = _maximum(scaler)
        for env in consumers.get(str(dig(scaler, "spec", "scaleTargetRef", "name")), []):
            pool = int(env.get("EXPIRY_DB_POOL_SIZE", POOL_SIZE_DEFAULT))
            if most * pool > DIRECT_BUDGET and env.get("EXPIRY_DB_POOLER") != POOLED:
                problems.append(
                    f"{ident(scaler)}: up to {most} consumers x EXPIRY_DB_POOL_SIZE {pool} = "
                    f"{most * pool} PostgreSQL connections, over {DIRECT_BUDGET} (max_connections "
                    "100 by default, less the other processes'): lower the maximum, or go "
                    "through a transaction pooler (components/pooler: EXPIRY_DB_POOLER=transaction)"
                )


def relay_session(objects: list[Obj], problems: list[str]) -> None:
    """A relay behind a transaction pooler has a direct URL to LISTEN on (or only polls)."""
    maps = config_maps(objects)
    for obj, template in workloads(objects):
        for container in containers(template):
            if not _runs(container, "service.relay"):
                continue
            env = plain_env(container, maps)
            if env.get("EXPIRY_DB_POOLER") == POOLED and "EXPIRY_DB_SESSION_URL" not in (
                env.keys() | env_of(container).keys()
            ):
                problems.append(
                    f"{ident(obj)}: EXPIRY_DB_POOLER=transaction without EXPIRY_DB_SESSION_URL: "
                    "the relay only polls (relay.polling_only); reference it (components/pooler)"
                )
