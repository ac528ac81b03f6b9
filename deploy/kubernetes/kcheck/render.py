"""Rendering every combination the tree ships, with ``kubectl kustomize``.

Each profile (overlays/small, overlays/large) is rendered as shipped, and again with each
other choice of its Components (autoscaler x scan mode x monitoring on or off), and once
with the opt-in webhook deliverer (components/webhooks) added to what it ships: those
variants are the profile's kustomization.yaml with its ``components`` list replaced,
written to .cache/v-RUN-NAME, at the same depth, so its relative paths hold. Then each profile's
setup (migrate, declare) and the namespace.

A derived profile (overlays/large-pooler: overlays/large as its resource, plus Components and
patches of its own) is rendered as shipped, on its profile with the CPU autoscaler instead
of KEDA (its patches bound both) and with the webhook deliverer, and its setup.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML

from kcheck import tools
from kcheck.manifests import HERE, Obj, Result, dump_stream, load_stream

PROFILES = ("small", "large")
# Derived profile: the profile it is built on (its only resource, ../../overlays/PROFILE).
DERIVED = {"large-pooler": "large"}
AUTOSCALERS = ("autoscale-keda", "autoscale-cpu")
SCANS = ("scan-cron", "scan-every")
# The order every profile lists them in: the image last (see components/image).
FIRST = ("settings", "network-policies")
LAST = ("image",)


@dataclass(frozen=True)
class Rendering:
    """One rendered kustomization: its name, its directory and the YAML file it gave."""

    name: str
    directory: Path
    file: Path


def components_for(autoscaler: str, scan: str, monitoring: bool) -> list[str]:
    """The components of one combination, in the order the profiles use."""
    chosen = [*FIRST, autoscaler, scan]
    if monitoring:
        chosen.append("monitoring")
        if scan == "scan-cron":
            chosen.append("monitoring-scan-cron")
    return [*chosen, *LAST]


def shipped_components(profile: str) -> list[str]:
    """The component names a profile's kustomization.yaml lists, in order."""
    data = YAML(typ="safe").load(HERE / "overlays" / profile / "kustomization.yaml")
    return [Path(entry).name for entry in data.get("components", [])]


def variant_directory(profile: str, components: list[str], workdir: Path) -> Path:
    """A kustomization: the profile's, with these components (the shipped one itself when
    they are the profile's own)."""
    if components == shipped_components(profile):
        return HERE / "overlays" / profile
    yaml = YAML()
    yaml.preserve_quotes = True
    source = HERE / "overlays" / profile / "kustomization.yaml"
    data = yaml.load(source)
    data["components"] = [f"../../components/{name}" for name in components]
    tag = "-".join(name.removeprefix("autoscale-") for name in components if name not in FIRST)
    # .cache/v-RUN-NAME: two levels below deploy/kubernetes, as overlays/<profile> is.
    directory = tools.CACHE / f"v-{workdir.name}-{profile}-{tag}"
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "kustomization.yaml").open("w", encoding="utf-8") as out:
        yaml.dump(data, out)
    return directory


def setup_with(profile: str, component: str, workdir: Path) -> Path:
    """A profile's setup with one more Component (before the image), written to
    .cache/v-RUN-PROFILE-setup-COMPONENT/setup: three levels below deploy/kubernetes, as
    overlays/<profile>/setup is, so that its relative paths hold."""
    yaml = YAML()
    yaml.preserve_quotes = True
    data = yaml.load(HERE / "overlays" / profile / "setup" / "kustomization.yaml")
    components = list(data.get("components", []))
    image = next(i for i, entry in enumerate(components) if Path(entry).name == "image")
    components.insert(image, f"../../../components/{component}")
    data["components"] = components
    directory = tools.CACHE / f"v-{workdir.name}-{profile}-setup-{component}" / "setup"
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "kustomization.yaml").open("w", encoding="utf-8") as out:
        yaml.dump(data, out)
    return directory


def derived_directory(derived: str, profile_directory: Path, workdir: Path) -> Path:
    """A derived profile's kustomization on another rendering of its profile (a variant's
    directory, a sibling in .cache)."""
    yaml = YAML()
    yaml.preserve_quotes = True
    data = yaml.load(HERE / "overlays" / derived / "kustomization.yaml")
    profile = DERIVED[derived]
    on = profile_directory.name.removeprefix(f"v-{workdir.name}-")
    directory = tools.CACHE / f"v-{workdir.name}-{derived}-on-{on}"
    directory.mkdir(parents=True, exist_ok=True)
    data["resources"] = [
        os.path.relpath(profile_directory, directory)
        if entry == f"../../overlays/{profile}"
        else entry
        for entry in data["resources"]
    ]
    with (directory / "kustomization.yaml").open("w", encoding="utf-8") as out:
        yaml.dump(data, out)
    return directory


def derived_targets(workdir: Path) -> list[tuple[str, Path]]:
    """(name, directory) of each derived profile: as shipped, on its profile with the CPU
    autoscaler and with the webhook deliverer, and its setup."""
    found: list[tuple[str, Path]] = []
    for derived, profile in DERIVED.items():
        shipped_name = f"{derived} (shipped): {profile} + its components and patches"
        found.append((shipped_name, HERE / "overlays" / derived))
        shipped = shipped_components(profile)
        variants = {
            "autoscale-cpu": [
                "autoscale-cpu" if name == "autoscale-keda" else name for name in shipped
            ],
            "webhooks": [*shipped[:-1], "webhooks", *shipped[-1:]],
        }
        for what, components in variants.items():
            on = variant_directory(profile, components, workdir)
            found.append(
                (f"{derived}: on {profile} with {what}", derived_directory(derived, on, workdir))
            )
        found.append((f"{derived}/setup", HERE / "overlays" / derived / "setup"))
    return found


def targets(workdir: Path) -> list[tuple[str, Path]]:
    """(name, kustomization directory) of every rendering: each profile in every
    combination, each profile's setup, the derived profiles, the namespace."""
    found: list[tuple[str, Path]] = []
    for profile in PROFILES:
        shipped = shipped_components(profile)
        for autoscaler, scan, monitoring in itertools.product(AUTOSCALERS, SCANS, (True, False)):
            components = components_for(autoscaler, scan, monitoring)
            directory = variant_directory(profile, components, workdir)
            mark = " (shipped)" if components == shipped else ""
            name = f"{profile}: {autoscaler}, {scan}, monitoring {'on' if monitoring else 'off'}"
            found.append((name + mark, directory))
        # The opt-in webhook deliverer, on the shipped combination (before the image); and
        # with TLS to the servers too (components/tls mounts its Secret in every workload).
        with_webhooks = [*shipped[:-1], "webhooks", *shipped[-1:]]
        found.append(
            (f"{profile}: shipped + webhooks", variant_directory(profile, with_webhooks, workdir))
        )
        with_tls = [*shipped[:-1], "webhooks", "tls", *shipped[-1:]]
        found.append(
            (f"{profile}: shipped + webhooks + tls", variant_directory(profile, with_tls, workdir))
        )
        found.append((f"{profile}/setup", HERE / "overlays" / profile / "setup"))
        found.append((f"{profile}/setup + tls", setup_with(profile, "tls", workdir)))
    found += derived_targets(workdir)
    found.append(("namespace", HERE / "namespace"))
    return found


def kustomize(directory: Path) -> str:
    """``kubectl kustomize DIR``: the rendered YAML (raises with kustomize's message)."""
    done = subprocess.run(
        [tools.kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        where = directory.resolve()
        shown = where.relative_to(HERE) if where.is_relative_to(HERE) else where
        raise RuntimeError(f"{shown}: {done.stderr.strip()}")
    return done.stdout


def render_all(out: Path) -> tuple[list[Rendering], Result]:
    """Render every target into ``out`` (one file each); the result counts the kinds."""
    result = Result("render")
    workdir = tools.workdir()
    out.mkdir(parents=True, exist_ok=True)
    renderings = []
    found = targets(workdir)
    made = {d if d.name.startswith("v-") else d.parent for _, d in found}
    for directory in {d for d in made if d.name.startswith("v-")}:
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    for index, (name, directory) in enumerate(found):
        try:
            text = kustomize(directory)
        except RuntimeError as exc:
            result.problems.append(f"{name}: kubectl kustomize failed: {exc}")
            continue
        file = out / f"{index:02d}-{directory.name}.yaml"
        file.write_text(text, encoding="utf-8")
        renderings.append(Rendering(name, directory, file))
        kinds = Counter(str(obj.get("kind")) for obj in load_stream(file))
        counted = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
        result.figures.append(f"{name}: {sum(kinds.values())} objects ({counted})")
    return renderings, result


def write_objects(objects: list[Obj], path: Path) -> Path:
    """Write objects as one YAML stream."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_stream(objects), encoding="utf-8")
    return path
