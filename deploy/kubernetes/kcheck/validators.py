"""The three outside validators, each run once over the distinct objects of every
rendering: kubernetes-validate (Kubernetes' own kinds, strict, two releases), crds.mjs
(KEDA's and the Prometheus Operator's kinds) and checkov (pod security and the rest of its
Kubernetes checks, less a skip list with reasons), the last with the Pod Security
Standard "restricted" the namespace enforces (kcheck/podsecurity.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kcheck import podsecurity, tools
from kcheck.manifests import HERE, Obj, Result, dig, digest, ident, is_core, load_stream
from kcheck.render import write_objects

# checkov's Kubernetes checks that do not apply here, and why (every other one runs).
CHECKOV_SKIPS = {
    "CKV_K8S_15": (
        "imagePullPolicy Always: the image is pinned (tag, and a digest in components/image);"
        " IfNotPresent is reproducible, and Always would make every restart depend on the"
        " registry"
    ),
    "CKV_K8S_35": (
        "secrets as files: the service reads DATABASE_URL, AMQP_URL and its keys from the"
        " environment (service/settings/; only the webhook endpoints come as a file, from the"
        " Secret expiry-webhooks: components/webhooks/deliver.yaml), and never logs them"
    ),
    "CKV_K8S_43": (
        "image by digest: the shipped reference is a placeholder; the digest is each"
        " build's, set in components/image"
    ),
}


@dataclass(frozen=True)
class Distinct:
    """One distinct object, the file it was written to, and the renderings holding it."""

    obj: Obj
    file: Path
    sources: list[str]


def distinct(files: list[Path], workdir: Path, *, core: bool) -> list[Distinct]:
    """Each distinct Kubernetes (``core``) or custom object of the files, one file each."""
    shutil.rmtree(workdir, ignore_errors=True)
    seen: dict[str, Distinct] = {}
    for source in files:
        for obj in load_stream(source):
            if is_core(obj) != core:
                continue
            key = digest(obj)
            if key not in seen:
                name = f"{obj.get('kind')}-{obj.get('metadata', {}).get('name')}-{key}.yaml"
                seen[key] = Distinct(obj, write_objects([obj], workdir / name), [])
            seen[key].sources.append(source.name)
    return list(seen.values())


def _where(found: list[Distinct], line: str) -> str:
    """The renderings of the object a tool's output line names by its file."""
    for item in found:
        if str(item.file) in line or item.file.name in line:
            return f" [in {', '.join(sorted(set(item.sources)))}]"
    return ""


def schemas(files: list[Path]) -> Result:
    """Kubernetes' own kinds against its JSON schemas, strict (an unknown field fails)."""
    result = Result("schemas")
    found = distinct(files, tools.workdir() / "objects-core", core=True)
    if not found:
        result.figures.append("no Kubernetes object to validate")
        return result
    command = [tools.kubernetes_validate(), "--strict", "--quiet"]
    for version in tools.KUBERNETES_VERSIONS:
        command += ["-k", version]
    done = subprocess.run(
        [*command, *(str(item.file) for item in found)], capture_output=True, text=True
    )
    for line in (done.stdout + done.stderr).splitlines():
        # ERROR: invalid; WARN: no schema for the kind (so nothing checked it): both fail.
        if line.startswith(("ERROR", "WARN", "FATAL")):
            result.problems.append(line.replace(str(tools.workdir()), "") + _where(found, line))
    if done.returncode != 0 and not result.problems:
        result.problems.append(f"kubernetes-validate exited {done.returncode}: {done.stderr}")
    kinds = Counter(str(item.obj.get("kind")) for item in found)
    version = tools.version_line([tools.kubernetes_validate(), "--version"])
    result.figures.append(
        f"kubernetes-validate {version} --strict, Kubernetes "
        f"{' and '.join(tools.KUBERNETES_VERSIONS)}: {len(found)} distinct objects "
        f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) from {len(files)} file(s)"
    )
    return result


def crds(files: list[Path]) -> Result:
    """Custom resources against their CRDs' schemas (validate/crds.mjs)."""
    result = Result("crds")
    found = distinct(files, tools.workdir() / "objects-custom", core=False)
    if not found:
        result.figures.append("no custom resource to validate")
        return result
    done = subprocess.run(
        [tools.node(), str(HERE / "validate" / "crds.mjs"), *(str(item.file) for item in found)],
        capture_output=True,
        text=True,
    )
    for line in done.stderr.splitlines():
        if line.strip() and not line.startswith("npm warn"):
            result.problems.append(line.replace(str(tools.workdir()), "") + _where(found, line))
    try:
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result.problems.append(f"crds.mjs said nothing readable (exit {done.returncode})")
        return result
    if done.returncode != 0 and not result.problems:
        result.problems.append(f"crds.mjs exited {done.returncode}")
    counted = ", ".join(f"{k} {n}" for k, n in sorted(summary["validated"].items()))
    result.figures.append(
        f"@kubernetes-models (keda, prometheus-operator): {len(found)} distinct custom "
        f"resources, valid: {counted or 'none'}"
    )
    return result


def policy(files: list[Path]) -> Result:
    """checkov's Kubernetes checks (pod security among them) over every object, and the
    Pod Security Standard "restricted" over every pod template."""
    result = Result("policy")
    found = distinct(files, tools.workdir() / "objects-policy", core=True)
    if not found:
        result.figures.append("no Kubernetes object to check")
        return result
    result.problems += podsecurity.violations([item.obj for item in found])
    pods = sum(1 for item in found if item.obj.get("kind") in ("Deployment", "CronJob", "Job"))
    result.figures.append(
        f"Pod Security Standard restricted (v1.30), as namespace/ enforces it: {pods} pod "
        f"templates, {len(result.problems)} violation(s)"
    )
    # From inside the folder: checkov silently skips a --directory whose path has a
    # hidden component (.cache), and would then report 0 resources, all passed.
    done = subprocess.run(
        [
            tools.checkov(),
            *("--directory", "."),
            *("--framework", "kubernetes", "--output", "json", "--skip-download"),
            *("--skip-check", ",".join(sorted(CHECKOV_SKIPS))),
        ],
        capture_output=True,
        text=True,
        cwd=tools.workdir() / "objects-policy",
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        result.problems.append(f"checkov gave no report (exit {done.returncode}): {done.stderr}")
        return result
    report = report[0] if isinstance(report, list) else report
    for failed in dig(report, "results", "failed_checks") or []:
        obj = next((i for i in found if str(i.file).endswith(failed["file_path"])), None)
        where = f" [in {', '.join(sorted(set(obj.sources)))}]" if obj else ""
        result.problems.append(
            f"{failed['check_id']} {failed['resource']}: {failed['check_name']}{where}"
        )
    summary = report["summary"]
    if summary["resource_count"] < len(found):
        result.problems.append(
            f"checkov read {summary['resource_count']} resources of {len(found)} objects given"
        )
        return result
    result.figures.append(
        f"checkov {summary['checkov_version']}: {summary['resource_count']} distinct objects, "
        f"{summary['passed']} checks passed, {summary['failed']} failed; skipped: "
        + "; ".join(f"{check} ({why})" for check, why in CHECKOV_SKIPS.items())
    )
    if not dig(report, "results", "failed_checks") and done.returncode != 0:
        result.problems.append(f"checkov exited {done.returncode}: {done.stderr[-500:]}")
    kinds = Counter(ident(item.obj).split("/")[0] for item in found)
    result.figures.append("checked kinds: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
    return result
