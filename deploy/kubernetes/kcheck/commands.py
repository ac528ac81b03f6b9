"""Every container runs a command the image has, with arguments it accepts, in an
environment its settings accept.

A command must be ``python -m service.<module> ARGS`` where ``service/<module>.py`` or
``service/<module>/__main__.py`` exists, and its parser must accept ARGS. Not by appending
``--help``: argparse prints the help, and exits 0, before it reports an unknown option. The
command runs for real instead, with EXPIRY_LOG_LEVEL set to a value the settings refuse:
every command parses its arguments, then loads its settings (service/cli.py), so "accepted"
is exactly its one-line configuration error about EXPIRY_LOG_LEVEL, before it connects to
anything. Each container's environment (its ConfigMaps, its own values, placeholders for
its Secrets' required keys) must load as ``service.settings.Settings``: an unknown EXPIRY_*
name or a bad value stops every command at start. A setting that names a file of a mounted
Secret (EXPIRY_WEBHOOKS_FILE) names a placeholder file of that key instead.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kcheck import tools
from kcheck.manifests import (
    REPO,
    Obj,
    Result,
    config_maps,
    containers,
    ident,
    load_stream,
    plain_env,
    workloads,
)

PREFIX = ["python", "-m"]
# What a Secret's key stands for when the settings are loaded (valid, and unreachable).
PLACEHOLDERS = {
    "DATABASE_URL": "postgresql://role:placeholder@db.invalid:5432/expiry",
    "AMQP_URL": "amqp://user:placeholder@broker.invalid:5672/",
    "EXPIRY_MANAGEMENT_URL": "http://user:placeholder@broker.invalid:15672",
    "EXPIRY_CONSOLE_USERS": "alice:scrypt$32768$8$1$c2FsdA$aGFzaA",
    "EXPIRY_CONSOLE_SECRET": "placeholder-secret-of-at-least-32-characters",
    "EXPIRY_REPLAY_OPERATORS": "alice",
    "EXPIRY_CONSOLE_TRUSTED_HEADER": "X-Forwarded-User",
}
# What a mounted Secret's key (a file) holds when the settings are loaded: valid, unreachable.
FILE_PLACEHOLDERS = {
    "webhooks.json": json.dumps(
        [
            {
                "name": "placeholder",
                "url": "https://receiver.invalid/hooks",
                "secret": "whsec_" + base64.b64encode(b"placeholder-key-32-bytes-long!!!").decode(),
            }
        ]
    ),
}
LOAD_SETTINGS = """
import json, os, sys
from service.settings import load_settings
failures = 0
for label, env in json.load(sys.stdin):
    os.environ.clear()
    os.environ.update(env)
    try:
        load_settings()
    except Exception as exc:
        failures += 1
        print(f"{label}: settings refused: {exc}".splitlines()[0])
sys.exit(1 if failures else 0)
"""


def module_exists(module: str) -> bool:
    """Whether ``python -m module`` names a module of the image's ``service`` package."""
    if not module.startswith("service.") or module == "service.":
        return False
    path = REPO / Path(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def command_of(container: Obj) -> list[str]:
    """The argv a container runs (its command, then its args)."""
    return [str(a) for a in container.get("command") or []] + [
        str(a) for a in container.get("args") or []
    ]


SENTINEL = "EXPIRY_LOG_LEVEL"
ACCEPTED = f"configuration error: {SENTINEL}"


def _accepts(argv: list[str]) -> tuple[list[str], bool, str]:
    """Whether the command's parser accepts argv (see the module's docstring)."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), SENTINEL: "refused"}
    with tempfile.TemporaryDirectory() as cwd:  # no .env file of this checkout is read
        done = subprocess.run(
            [tools.python(), *argv[1:]],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=120,
        )
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return argv, done.returncode == 2 and ACCEPTED in last, last


def secret_files(template: Obj, container: Obj) -> dict[str, tuple[str, str]]:
    """The files a container sees of its pod's Secret volumes: path -> (Secret, key)."""
    secrets = {
        volume["name"]: volume["secret"]
        for volume in (template.get("spec") or {}).get("volumes") or []
        if isinstance(volume.get("secret"), dict)
    }
    files: dict[str, tuple[str, str]] = {}
    for mount in container.get("volumeMounts") or []:
        secret = secrets.get(mount.get("name"))
        if secret is None:
            continue
        root = str(mount["mountPath"]).rstrip("/")
        items = secret.get("items") or []
        for item in items:
            files[f"{root}/{item['path']}"] = (str(secret.get("secretName")), str(item["key"]))
        if not items:  # every key, each a file of its name: named by the path itself
            files[f"{root}/*"] = (str(secret.get("secretName")), "*")
    return files


def _environment(
    template: Obj, container: Obj, maps: dict[str, dict[str, str]], scratch: Path
) -> dict[str, str]:
    env = plain_env(container, maps)
    for entry in container.get("env") or []:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref and not ref.get("optional", False):
            env[entry["name"]] = PLACEHOLDERS.get(entry["name"], "placeholder")
    files = secret_files(template, container)
    for name, value in env.items():
        found = files.get(value) or files.get(f"{value.rpartition('/')[0]}/*")
        if found is None:
            continue
        key = found[1] if found[1] != "*" else value.rpartition("/")[2]
        placeholder = scratch / key
        placeholder.write_text(FILE_PLACEHOLDERS.get(key, "placeholder"), encoding="utf-8")
        env[name] = str(placeholder)
    return env


def check(files: list[Path]) -> Result:
    """Every container's command, its arguments and its settings."""
    result = Result("commands")
    argvs: dict[tuple[str, ...], list[str]] = {}
    envs: dict[str, tuple[str, dict[str, str]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="kcheck-secret-files-"))
    for file in files:
        objects = load_stream(file)
        maps = config_maps(objects)
        for obj, template in workloads(objects):
            for container in containers(template):
                where = f"{file.name}: {ident(obj)} container {container.get('name')}"
                argv = command_of(container)
                if argv[:2] != PREFIX or len(argv) < 3 or not module_exists(argv[2]):
                    result.problems.append(
                        f"{where}: runs {argv}, not `python -m service.<module>` of the image"
                    )
                    continue
                argvs.setdefault(tuple(argv), []).append(where)
                env = _environment(template, container, maps, scratch)
                envs.setdefault(json.dumps(env, sort_keys=True), (where, env))
    with ThreadPoolExecutor(max_workers=2) as pool:
        for argv, accepted, last in pool.map(_accepts, [list(a) for a in argvs]):
            if not accepted:
                first = argvs[tuple(argv)][0]
                result.problems.append(f"{first}: `{' '.join(argv)}` refused: {last}")
    try:
        result.problems += _load_settings(list(envs.values()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.figures.append(
        f"{len(argvs)} distinct commands, their arguments accepted by the image's parsers: "
        + "; ".join(" ".join(a[2:]).removeprefix("service.") for a in sorted(argvs))
    )
    result.figures.append(f"{len(envs)} distinct container environments loaded as Settings")
    return result


def _load_settings(envs: list[tuple[str, dict[str, str]]]) -> list[str]:
    if not envs:
        return []
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [tools.python(), "-c", LOAD_SETTINGS],
            input=json.dumps([[label, env] for label, env in envs]),
            capture_output=True,
            text=True,
            cwd=cwd,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
            timeout=120,
        )
    problems = done.stdout.strip().splitlines()
    if done.returncode != 0 and not problems:
        problems = [f"loading the settings failed: {done.stderr.strip()[-300:]}"]
    return problems
