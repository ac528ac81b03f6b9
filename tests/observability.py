"""What the alert rules and the dashboard ask of the metrics: their PromQL, and the metric
names in it (shared by the unit check and the real-Prometheus test)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.support import REPO

RULES = REPO / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "grafana" / "dashboards" / "expiry.json"
METRIC = re.compile(r"\b((?:expiry|rabbitmq)_[a-z_]+)\b")


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML file, parsed safely."""
    loaded: dict[str, Any] = YAML(typ="safe").load(path.read_text())
    return loaded


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of prometheus/alerts.yml."""
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    """The provisioned dashboard."""
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def expressions() -> list[str]:
    """Every PromQL expression of the rules and of the dashboard's panels."""
    found = [str(rule["expr"]) for rule in alert_rules()]
    found += [
        str(target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]
    return found


def metric_names() -> set[str]:
    """The metric names those expressions use."""
    return {name for expr in expressions() for name in METRIC.findall(expr)}
