"""The offline checks of deploy/kubernetes (no cluster, no registry): what
.ci/kubernetes-checks runs and tests/deploy/test_kubernetes.py calls.

    python deploy/kubernetes/check.py all                 # render everything, run every check
    python deploy/kubernetes/check.py render [--out DIR]  # render every combination
    python deploy/kubernetes/check.py CHECK FILE...       # one check over rendered YAML streams
    python deploy/kubernetes/check.py tools               # what is missing (exit 3 if any)
    python deploy/kubernetes/check.py kustomize DIR       # kubectl kustomize DIR (the checks')

CHECK is one of: schemas (Kubernetes' kinds against its JSON schemas, strict), crds (KEDA's
and the Prometheus Operator's kinds against their CRDs' schemas), policy (checkov: pod
security and its other Kubernetes checks), rules (the PrometheusRule against
prometheus/alerts.yml, the dashboard against its JSON), commands (each container's
command, arguments and settings), consistency (what no schema knows: kcheck/consistency.py).

Run with the repository's environment (.venv/bin/python: ruamel.yaml, the service's
settings). Exit 0: every check passed; 1: a problem (one line each); 2: usage; 3: a tool is
missing (.ci/kubernetes-checks installs them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kcheck import commands, consistency, rules, tools, validators
from kcheck.manifests import Result
from kcheck.render import kustomize as render_kustomize
from kcheck.render import render_all

CHECKS: dict[str, Callable[[list[Path]], Result]] = {
    "schemas": validators.schemas,
    "crds": validators.crds,
    "policy": validators.policy,
    "rules": rules.check,
    "commands": commands.check,
    "consistency": consistency.check,
}
EXIT_PROBLEMS, EXIT_MISSING = 1, 3


def report(result: Result, seconds: float) -> None:
    """A check's figures, then its problems, then its verdict."""
    print(f"\n== {result.name} ({seconds:.1f}s)")
    for line in result.figures:
        print(f"   {line}")
    for line in result.problems:
        print(f"   FAIL {line}")
    verdict = "ok" if result.ok else f"{len(result.problems)} problem(s)"
    print(f"   {result.name}: {verdict}")


def run(names: list[str], files: list[Path]) -> list[Result]:
    """Run the named checks over the files, reporting each as it ends."""
    results = []
    for name in names:
        started = time.monotonic()
        result = CHECKS[name](files)
        report(result, time.monotonic() - started)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, and exit with the verdict."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    every = sub.add_parser("all", help="render everything, then run every check")
    every.add_argument("--out", type=Path, help="keep the renderings there")
    render = sub.add_parser("render", help="render every combination into --out")
    render.add_argument("--out", type=Path, default=tools.CACHE / "rendered")
    sub.add_parser("tools", help="say what is missing")
    kustomize = sub.add_parser("kustomize", help="print one kustomization's rendering")
    kustomize.add_argument("directory", type=Path)
    for name in CHECKS:
        one = sub.add_parser(name, help=f"the {name} check over rendered YAML files")
        one.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "tools":
            missing = tools.all_present()
            print("\n".join(missing) or "every tool is installed")
            return EXIT_MISSING if missing else 0
        if args.command == "kustomize":
            print(render_kustomize(args.directory), end="")
            return 0
        if args.command in CHECKS:
            results = run([args.command], args.files)
        else:
            started = time.monotonic()
            args.out = args.out or tools.workdir() / "rendered"
            for old in args.out.glob("*.yaml"):
                old.unlink()
            renderings, rendered = render_all(args.out)
            report(rendered, time.monotonic() - started)
            results = [rendered]
            if args.command == "all" and rendered.ok:
                results += run(list(CHECKS), [r.file for r in renderings])
    except tools.Missing as exc:
        print(f"check.py: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except RuntimeError as exc:  # kubectl kustomize refused: its message
        print(f"check.py: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    failed = [r.name for r in results if not r.ok]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'every check passed'}")
    return EXIT_PROBLEMS if failed else 0


if __name__ == "__main__":
    sys.exit(main())
