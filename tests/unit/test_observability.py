"""The alert rules and the dashboard ask only for metrics docs/operations.md documents
(and RabbitMQ's plugin exports), each alert says what to do and links its runbook there."""

from __future__ import annotations

import re

from tests.observability import alert_rules, dashboard, metric_names
from tests.support import REPO

OPERATIONS_PAGE = "docs/operations.md"
OPERATIONS = (REPO / OPERATIONS_PAGE).read_text()
RABBITMQ = {
    "rabbitmq_detailed_queue_messages_ready",
    "rabbitmq_detailed_queue_messages_unacked",
    "rabbitmq_detailed_queue_consumers",
}
HISTOGRAM_SERIES = re.compile(r"_(bucket|count|sum)$")


def documented_metrics() -> set[str]:
    """The metric names of the operations page's metrics table."""
    return set(re.findall(r"^\| `(expiry_[a-z_]+)` \|", OPERATIONS, flags=re.MULTILINE))


def anchors() -> set[str]:
    """The operations page's headings, as GitHub makes their anchors."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", OPERATIONS, flags=re.MULTILINE)
    }


def test_every_metric_the_rules_and_the_dashboard_use_is_documented() -> None:
    """Each name is in the operations page's table (histograms by their _bucket/_count
    series) or is one of the RabbitMQ plugin's queue metrics."""
    documented = documented_metrics()
    assert len(documented) >= 20
    for name in metric_names():
        base = HISTOGRAM_SERIES.sub("", name)
        assert base in documented or name in RABBITMQ, name


def test_every_alert_tells_the_on_call_what_to_do_and_links_its_runbook() -> None:
    """A severity, a summary, and a runbook that is a heading of the operations page."""
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "ExpiryOldestDueHoldOverObjective",
        "ExpiryDeadLettersGrowing",
        "ExpiryLeasesLapsing",
        "ExpiryClockDrift",
        "ExpiryRetriesHigh",
        "ExpiryNoConsumer",
        "ExpiryScannerFailing",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert len(rule["annotations"]["summary"]) > 40, rule["alert"]
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert (page, anchor) == (OPERATIONS_PAGE, rule["alert"].lower())
        assert anchor in anchors(), f"no runbook section for {rule['alert']}"


def test_the_dashboard_queries_one_provisioned_prometheus_and_has_unique_panels() -> None:
    """Every panel with queries names the provisioned datasource; ids are unique."""
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    queried = [panel for panel in panels if panel.get("targets")]
    assert len(queried) >= 12
    for panel in queried:
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
        assert panel.get("description"), panel["title"]
