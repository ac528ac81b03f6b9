"""The PrometheusRule against prometheus/alerts.yml, parsed (not as text): the same groups
in the same order, the same rules, each with the same fields and values. Where the scan runs
from cron (the rendering holds the CronJob expiry-scan), exactly the alerts that read the
timer scanner's metrics may be missing, and nothing else. Also the dashboard ConfigMap
against grafana/dashboards/expiry.json, parsed as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from ruamel.yaml import YAML

from kcheck.manifests import REPO, Obj, Result, dig, load_stream
from kcheck.tools import Missing

ALERTS = REPO / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "grafana" / "dashboards" / "expiry.json"
RULE_NAME = "expiry-service"
# Dropped by components/monitoring-scan-cron (generate.py writes that patch).
CRON_DROPPED = frozenset({"ExpiryScannerAbsent"})
# The rules only Kubernetes has (components/monitoring-scan-cron), and promtool's tests of
# them, as prometheus/alerts.test.yml tests alerts.yml.
EXTRA_RULES_TESTS = Path(__file__).resolve().parents[1] / "components" / "monitoring-scan-cron"


def _rule_name(rule: Obj) -> str:
    return str(rule.get("alert") or rule.get("record") or "(unnamed)")


def compare_groups(
    expected: list[Obj], actual: list[Obj], allowed_missing: frozenset[str]
) -> list[str]:
    """How ``actual`` differs from ``expected``, one line per difference."""
    problems: list[str] = []
    if [g.get("name") for g in expected] != [g.get("name") for g in actual]:
        names = [g.get("name") for g in actual]
        return [f"groups {names} are not alerts.yml's {[g.get('name') for g in expected]}"]
    for want, got in zip(expected, actual, strict=True):
        group = want.get("name")
        fields = (set(want) | set(got)) - {"rules"}
        differing = sorted(k for k in fields if want.get(k) != got.get(k))
        if differing:
            problems.append(f"group {group}: {', '.join(differing)} differ from alerts.yml")
        want_rules = [r for r in want.get("rules") or [] if _rule_name(r) not in allowed_missing]
        got_rules = list(got.get("rules") or [])
        want_names = [_rule_name(r) for r in want_rules]
        got_names = [_rule_name(r) for r in got_rules]
        for name in sorted(set(want_names) - set(got_names)):
            problems.append(f"group {group}: rule {name} is missing")
        for name in sorted(set(got_names) - set(want_names)):
            problems.append(f"group {group}: rule {name} is not in alerts.yml (or must be dropped)")
        if set(want_names) == set(got_names) and want_names != got_names:
            problems.append(f"group {group}: the rules are in another order than alerts.yml's")
        by_name = {_rule_name(r): r for r in got_rules}
        for rule in want_rules:
            other = by_name.get(_rule_name(rule))
            if other is not None:
                problems += _compare_rule(f"group {group}: rule {_rule_name(rule)}", rule, other)
    return problems


def _compare_rule(where: str, want: Obj, got: Obj) -> list[str]:
    problems = []
    for key in sorted(set(want) | set(got)):
        if key not in got:
            problems.append(f"{where}: `{key}` is missing")
        elif key not in want:
            problems.append(f"{where}: `{key}` is not in alerts.yml")
        elif want[key] != got[key]:
            problems.append(f"{where}: `{key}` differs from alerts.yml")
    return problems


def alerts_groups(path: Path = ALERTS) -> list[Obj]:
    """alerts.yml's groups, parsed."""
    data = YAML(typ="safe").load(path)
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list):
        raise SystemExit(f"{path}: no groups")
    return groups


def _is_cron(objects: list[Obj]) -> bool:
    return any(
        o.get("kind") == "CronJob" and dig(o, "metadata", "name") == "expiry-scan" for o in objects
    )


def _check_rule(obj: Obj, expected: list[Obj], cron: bool) -> tuple[list[str], str]:
    """The problems of one PrometheusRule, and how many rules it has."""
    allowed = CRON_DROPPED if cron else frozenset()
    groups = dig(obj, "spec", "groups") or []
    problems = compare_groups(expected, groups, allowed)
    kept = {_rule_name(r) for g in groups for r in g.get("rules") or []} & CRON_DROPPED
    if cron and kept:
        problems.append(f"{', '.join(sorted(kept))} must be dropped where the scan is a CronJob")
    count = sum(len(g.get("rules") or []) for g in groups)
    dropped = ", ".join(sorted(CRON_DROPPED))
    return problems, f"{count} rules" + (f" (cron scan: without {dropped})" if cron else "")


def promtool_problems(extra: dict[str, Obj]) -> list[str]:
    """The PrometheusRules other than alerts.yml's, each through ``promtool check rules``, and
    promtool's unit tests of them (``*.test.yml`` beside them)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise Missing("promtool (Debian: apt install prometheus)")
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, obj in sorted(extra.items()):
            rules = Path(scratch) / f"{name}.yml"
            rules.write_text(json.dumps({"groups": dig(obj, "spec", "groups") or []}))
            done = subprocess.run(
                [promtool, "check", "rules", str(rules)], capture_output=True, text=True
            )
            if done.returncode != 0:
                problems.append(f"PrometheusRule {name}: promtool: {done.stdout}{done.stderr}")
        for test in sorted(EXTRA_RULES_TESTS.glob("*.test.yml")):
            beside = Path(scratch) / test.name  # promtool reads rule_files beside the test
            beside.write_text(test.read_text(encoding="utf-8"), encoding="utf-8")
            done = subprocess.run(
                [promtool, "test", "rules", str(beside)], capture_output=True, text=True
            )
            if done.returncode != 0:
                problems.append(f"{test.name}: promtool: {done.stdout}{done.stderr}")
    return problems


def check(files: list[Path]) -> Result:
    """Each file's PrometheusRule expiry-service and dashboard ConfigMap against their
    sources."""
    result = Result("rules")
    expected = alerts_groups()
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    counts: dict[str, int] = {}
    extra: dict[str, Obj] = {}
    for file in files:
        objects = load_stream(file)
        cron = _is_cron(objects)
        for obj in objects:
            name = dig(obj, "metadata", "name")
            if obj.get("kind") == "PrometheusRule" and name == RULE_NAME:
                problems, label = _check_rule(obj, expected, cron)
                result.problems += [f"{file.name}: PrometheusRule {name}: {p}" for p in problems]
                counts[label] = counts.get(label, 0) + 1
            elif obj.get("kind") == "PrometheusRule":
                extra[str(name)] = obj
            if obj.get("kind") == "ConfigMap" and name == "expiry-dashboard":
                text = dig(obj, "data", "expiry.json")
                if not isinstance(text, str) or json.loads(text) != dashboard:
                    source = DASHBOARD.relative_to(REPO)
                    result.problems.append(f"{file.name}: ConfigMap {name} is not {source}")
    result.problems += promtool_problems(extra)
    total = sum(len(g.get("rules") or []) for g in expected)
    seen = "; ".join(f"{label} in {n} file(s)" for label, n in sorted(counts.items()))
    result.figures.append(
        f"prometheus/alerts.yml: {len(expected)} group(s), {total} rules; PrometheusRule "
        f"{RULE_NAME}: {seen or 'none found'}"
    )
    others = ", ".join(sorted(extra)) or "none"
    result.figures.append(f"other PrometheusRules through promtool check and test: {others}")
    return result
