"""Write the kustomize tree's copies of the repository's alert rules and dashboard.

kustomize reads no file outside a kustomization's directory, so the Prometheus Operator
and Grafana objects of ``components/monitoring`` are generated from the files the rest of
the repository tests and mounts, never copied by hand:

- ``components/monitoring/prometheusrule.yaml``: a PrometheusRule whose ``spec.groups``
  is ``prometheus/alerts.yml``'s ``groups`` (promtool-tested), comments included;
- ``components/monitoring/grafana-dashboard.yaml``: a ConfigMap holding
  ``grafana/dashboards/expiry.json`` unchanged, labelled for Grafana's dashboard sidecar;
- ``components/monitoring-scan-cron/without-scanner-absent.yaml``: the JSON patch that
  drops ExpiryScannerAbsent from that PrometheusRule when the scan runs from cron (no
  process serves the scanner's metrics then, so the alert would page for ever); it tests
  the rule's name before removing it by position, so it cannot remove another rule.

Run from anywhere with the repository's environment (ruamel.yaml)::

    .venv/bin/python deploy/kubernetes/generate.py           # write the files
    .venv/bin/python deploy/kubernetes/generate.py --check   # exit 1, one line, if stale
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ALERTS = REPO / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "grafana" / "dashboards" / "expiry.json"
RULE_FILE = Path("components/monitoring/prometheusrule.yaml")
DASHBOARD_FILE = Path("components/monitoring/grafana-dashboard.yaml")
CRON_PATCH_FILE = Path("components/monitoring-scan-cron/without-scanner-absent.yaml")
RULE_NAME = "expiry-service"
# Served only by `produce --every`: absent for ever when the scan runs from cron.
CRON_DROPPED_ALERT = "ExpiryScannerAbsent"
LABELS = {
    "app.kubernetes.io/name": "expiry-service",
    "app.kubernetes.io/part-of": "expiry-service",
}
REGENERATE = "run .venv/bin/python deploy/kubernetes/generate.py"


@dataclass(frozen=True)
class Output:
    """A generated file: where it goes (relative to deploy/kubernetes) and its text."""

    path: Path
    text: str


def _yaml() -> YAML:
    """Round-trip YAML laid out as the rest of the tree (and alerts.yml) is."""
    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 100
    yaml.preserve_quotes = True
    return yaml


def _dump(data: Any, header: str, *, top_sequence: bool = False) -> str:
    yaml = _yaml()
    if top_sequence:  # a list at the top level starts at column 0
        yaml.indent(mapping=2, sequence=2, offset=0)
    out = io.StringIO()
    yaml.dump(data, out)
    return header + out.getvalue()


def _header(*lines: str) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def _source(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def load_alerts(path: Path = ALERTS) -> CommentedMap:
    """alerts.yml, parsed round-trip (block styles and positions kept)."""
    with path.open(encoding="utf-8") as source:
        loaded = _yaml().load(source)
    if not isinstance(loaded, CommentedMap) or not isinstance(loaded.get("groups"), list):
        raise SystemExit(f"{_source(path)}: no `groups:` list")
    return loaded


def _metadata(name: str, extra_labels: dict[str, str] | None = None) -> CommentedMap:
    metadata = CommentedMap()
    metadata["name"] = name
    metadata["labels"] = CommentedMap({**LABELS, **(extra_labels or {})})
    return metadata


def _folded_with_breaks(node: Any, found: list[tuple[int, int, str]]) -> None:
    """(line, column of the key, value) of every folded block (`>-`) whose value keeps a
    line break (a more-indented line): kustomize's YAML library writes those back with an
    extra blank line, which changes the value (kubernetes-sigs/kustomize round-trip)."""
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            if isinstance(value, FoldedScalarString) and "\n" in value:
                line, column = node.lc.key(key)
                found.append((line, column, str(value)))
            else:
                _folded_with_breaks(value, found)
    elif isinstance(node, CommentedSeq):
        for value in node:
            _folded_with_breaks(value, found)


def _as_literal_blocks(lines: list[str], alerts: CommentedMap) -> list[str]:
    """The lines, each folded block with line breaks rewritten as a literal block (`|-`)
    holding exactly its value, which kustomize keeps as it is."""
    blocks: list[tuple[int, int, str]] = []
    _folded_with_breaks(alerts, blocks)
    out = list(lines)
    for line, column, value in sorted(blocks, reverse=True):  # from the end: indexes hold
        key_line = out[line]
        if not key_line.rstrip().endswith(">-"):
            raise SystemExit(f"{_source(ALERTS)}:{line + 1}: expected a `>-` block")
        end = line + 1
        while end < len(out) and (not out[end].strip() or _indent(out[end]) > column):
            end += 1
        while end > line + 1 and not out[end - 1].strip():  # blank lines after it stay
            end -= 1
        body = [" " * (column + 2) + part if part else "" for part in value.split("\n")]
        out[line:end] = [key_line.rstrip()[:-2] + "|-", *body]
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def prometheus_rule(alerts: CommentedMap, alerts_path: Path = ALERTS) -> Output:
    """The PrometheusRule: alerts.yml from its `groups:` line on, as the spec, as text.

    Indented, not re-serialised: every comment and block scalar stays where the rules'
    authors put it, but for the folded blocks kustomize would change (_as_literal_blocks).
    .ci/kubernetes-checks parses alerts.yml and the rendered rule and compares them rule by
    rule; this refuses to write a rule that does not parse back to alerts.yml's.
    """
    lines = _as_literal_blocks(alerts_path.read_text(encoding="utf-8").splitlines(), alerts)
    try:
        start = lines.index("groups:")
    except ValueError:
        raise SystemExit(f"{_source(alerts_path)}: no top-level `groups:` line") from None
    spec = "".join(f"  {line}\n" if line.strip() else "\n" for line in lines[start:])
    head = CommentedMap()
    head["apiVersion"] = "monitoring.coreos.com/v1"
    head["kind"] = "PrometheusRule"
    head["metadata"] = _metadata(RULE_NAME)
    header = _header(
        f"GENERATED from {_source(alerts_path)} by deploy/kubernetes/generate.py: do not edit;",
        "change the rules there (promtool tests them), then run",
        ".venv/bin/python deploy/kubernetes/generate.py. Your Prometheus must select this",
        "object: add the label its ruleSelector asks for (kube-prometheus-stack: release:",
        "<its release name>) in your overlay.",
    )
    text = _dump(head, header) + "spec:\n" + spec
    parsed = YAML(typ="safe").load(text)["spec"]["groups"]
    if parsed != YAML(typ="safe").load(alerts_path)["groups"]:
        raise SystemExit(f"generate.py: the PrometheusRule would not be {_source(alerts_path)}")
    return Output(RULE_FILE, text)


def dashboard_config_map(dashboard_path: Path = DASHBOARD) -> Output:
    """The dashboard's JSON, unchanged, in a ConfigMap Grafana's sidecar picks up."""
    text = dashboard_path.read_text(encoding="utf-8")
    config_map = CommentedMap()
    config_map["apiVersion"] = "v1"
    config_map["kind"] = "ConfigMap"
    config_map["metadata"] = _metadata("expiry-dashboard", {"grafana_dashboard": "1"})
    config_map["data"] = CommentedMap({"expiry.json": LiteralScalarString(text)})
    header = _header(
        f"GENERATED from {_source(dashboard_path)} by deploy/kubernetes/generate.py: do not",
        f"edit; change the dashboard there, then {REGENERATE}.",
        "Grafana's dashboard sidecar (kube-prometheus-stack's) loads every ConfigMap labelled",
        'grafana_dashboard: "1"; the panels use the Prometheus data source of uid `prometheus`.',
        "A plain ConfigMap, not a generated one: a hash-suffixed name would leave the old",
        "copy behind, and the sidecar would load both.",
    )
    return Output(DASHBOARD_FILE, _dump(config_map, header))


def rule_position(alerts: CommentedMap, alert: str) -> tuple[int, int]:
    """(group index, rule index) of the rule named ``alert``."""
    for group_index, group in enumerate(alerts["groups"]):
        for rule_index, rule in enumerate(group.get("rules") or []):
            if rule.get("alert") == alert:
                return group_index, rule_index
    raise SystemExit(f"{_source(ALERTS)}: no rule named {alert}")


def cron_patch(alerts: CommentedMap) -> Output:
    """The JSON patch that drops the scanner's absence alert, guarded by a test."""
    group_index, rule_index = rule_position(alerts, CRON_DROPPED_ALERT)
    path = f"/spec/groups/{group_index}/rules/{rule_index}"
    ops = CommentedSeq(
        [
            CommentedMap({"op": "test", "path": f"{path}/alert", "value": CRON_DROPPED_ALERT}),
            CommentedMap({"op": "remove", "path": path}),
        ]
    )
    header = _header(
        f"GENERATED from {_source(ALERTS)} by deploy/kubernetes/generate.py: do not edit.",
        f"Drops {CRON_DROPPED_ALERT} from the PrometheusRule {RULE_NAME} when the scan runs",
        "from cron: only `produce --every` serves the scanner's metrics, so it would page for",
        "ever. The test fails the build if the rule is no longer at that position.",
    )
    return Output(CRON_PATCH_FILE, _dump(ops, header, top_sequence=True))


def outputs(alerts_path: Path = ALERTS, dashboard_path: Path = DASHBOARD) -> list[Output]:
    """Every generated file and what it should hold."""
    alerts = load_alerts(alerts_path)
    return [
        prometheus_rule(alerts, alerts_path),
        dashboard_config_map(dashboard_path),
        cron_patch(alerts),
    ]


def stale(tree: Path, expected: list[Output]) -> list[Path]:
    """The generated files under ``tree`` that differ from what this writes."""
    return [
        output.path
        for output in expected
        if not (tree / output.path).is_file()
        or (tree / output.path).read_text(encoding="utf-8") != output.text
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the files, or with --check say in one line which are stale (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    parser.add_argument(
        "--tree", type=Path, default=HERE, help="the kustomize tree (default: this file's folder)"
    )
    args = parser.parse_args(argv)
    expected = outputs()
    if args.check:
        differing = stale(args.tree, expected)
        if differing:
            names = ", ".join(path.as_posix() for path in differing)
            print(
                f"generate.py --check: not what generate.py writes: {names}: {REGENERATE}",
                file=sys.stderr,
            )
            return 1
        print(f"generate.py --check: {len(expected)} generated files are current")
        return 0
    for output in expected:
        target = args.tree / output.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(output.text, encoding="utf-8")
        print(f"wrote {target.relative_to(args.tree.resolve().parents[1]).as_posix()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
