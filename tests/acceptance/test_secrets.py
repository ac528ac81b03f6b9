"""No password in any output: every command, failing every way, with passwords full of @ : / % #."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import pytest

from tests.acceptance.processes import base_env, run
from tests.support import RUN_ID, Endpoints, Stack, pg_connection

pytestmark = pytest.mark.acceptance

PASSWORD = "Qz7@Wx8:Yv9/Pt6%Rs5#Nm4"
ENCODED = quote(PASSWORD, safe="")
RAW_AT = "Qz7@Wx8:Yv9"  # @ and : raw, as a careless operator writes them
FRAGMENTS = ("Qz7", "Wx8", "Yv9", "Pt6", "Rs5", "Nm4")
SHOWN_NEVER = (PASSWORD, ENCODED, ENCODED.lower(), quote(PASSWORD), RAW_AT, *FRAGMENTS)
CLOSED = "127.0.0.1:1"

COMMANDS: dict[str, tuple[str, ...]] = {
    "service.migrate": (),
    "service.declare": (),
    "service.produce": ("--scan",),
    "service.consume": (),
    "service.deadletters": ("list",),
    "service.status": (),
    "service.verify": (),
    "service.healthcheck": ("--timeout", "2"),
}


@dataclass(frozen=True)
class Expect:
    """A command's exit code and words one of which its one-line report holds."""

    code: int
    says: tuple[str, ...] = ()


def _everyone(code: int, *says: str) -> dict[str, Expect]:
    return {module: Expect(code, says) for module in COMMANDS}


def _report(module: str, result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines that say what failed: the command's own on stderr, or its screen's verdict."""
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"python -m {module}:")]
    verdicts = ("unhealthy:", "DOWN:")
    return lines + [line for line in result.stdout.splitlines() if line.startswith(verdicts)]


def _problems(
    module: str, verbose: bool, result: subprocess.CompletedProcess[str], expect: Expect
) -> list[str]:
    label = f"{module}{' --verbose' if verbose else ''}"
    output = result.stdout + result.stderr
    problems = [f"{label} shows {secret!r}" for secret in SHOWN_NEVER if secret in output]
    if result.returncode != expect.code:
        problems.append(f"{label}: exit {result.returncode}, not {expect.code}: {output[-800:]}")
    report = _report(module, result)
    if expect.code != 0 and not (len(report) == 1 and any(w in report[0] for w in expect.says)):
        problems.append(f"{label}: no one-line report saying one of {expect.says}: {report}")
    if not verbose and "Traceback" in result.stderr:
        problems.append(f"{label}: a traceback without --verbose")
    return problems


async def _run_every_command(env: dict[str, str], expected: dict[str, Expect]) -> list[str]:
    """Run each command, plain and with --verbose, all at once; return what went wrong."""
    runs = [(module, verbose) for module in expected for verbose in (False, True)]
    results = await asyncio.gather(
        *(
            asyncio.to_thread(
                run, module, *(["--verbose"] if verbose else []), *COMMANDS[module], env=env
            )
            for module, verbose in runs
        )
    )
    problems: list[str] = []
    for (module, verbose), result in zip(runs, results, strict=True):
        problems += _problems(module, verbose, result, expected[module])
    return problems


def _env(database_url: str, amqp_url: str) -> dict[str, str]:
    return {
        **base_env(),
        "DATABASE_URL": database_url,
        "AMQP_URL": amqp_url,
        "EXPIRY_LOG_FORMAT": "json",
        "EXPIRY_DB_CONNECT_TIMEOUT_SECONDS": "3",
        "EXPIRY_PUBLISH_TIMEOUT_SECONDS": "3",
    }


def _database_on(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return f"postgresql://{user}:{password}@{parts.hostname}:{parts.port or 5432}/postgres"


def _broker_on(url: str, password: str) -> str:
    parts = urlsplit(url)
    return f"amqp://{parts.username or 'guest'}:{password}@{parts.hostname}:{parts.port or 5672}/"


@pytest.mark.parametrize(
    ("database_url", "amqp_url", "expected"),
    [
        (
            f"postgresql://appuser:{ENCODED}@{CLOSED}/postgres",
            f"amqp://guest:{ENCODED}@{CLOSED}/",
            _everyone(1, "PostgreSQL", "RabbitMQ"),
        ),
        (
            f"postgresql://appuser:{ENCODED}@{CLOSED},{CLOSED}/postgres",
            f"amqp://guest:{RAW_AT}@{CLOSED}/,amqp://guest:{ENCODED}@{CLOSED}/",
            _everyone(1, "PostgreSQL", "RabbitMQ"),
        ),
        (
            f"postgresql://appuser:{RAW_AT}@{CLOSED}/postgres",
            f"amqp://guest:{ENCODED}@{CLOSED}/",
            _everyone(2, "configuration error: DATABASE_URL: not a valid URL"),
        ),
        (
            f"postgresql://appuser:{ENCODED}@{CLOSED}/postgres",
            f"amqp://guest:Qz7/Wx8@{CLOSED}/",
            _everyone(2, "configuration error: AMQP_URL: not a valid URL"),
        ),
    ],
    ids=["closed-ports", "raw-at-in-amqp-url", "raw-at-in-database-url", "raw-slash-in-amqp-url"],
)
async def test_no_password_when_nothing_answers(
    database_url: str, amqp_url: str, expected: dict[str, Expect]
) -> None:
    """Closed ports or a refused URL: each command says what failed, never the password."""
    assert await _run_every_command(_env(database_url, amqp_url), expected) == []


@pytest.fixture
async def refused_role(endpoints: Endpoints) -> AsyncIterator[str]:
    """A throwaway role with the password that PostgreSQL refuses to log in."""
    name = f"expiry_secret_{RUN_ID}"
    async with pg_connection(endpoints.database_url) as conn:
        # NOLOGIN: the local server trusts 127.0.0.1 (any password would do), so the
        # refusal comes from the role itself.
        await conn.execute(f"CREATE ROLE {name} NOLOGIN PASSWORD '{PASSWORD}'")
    try:
        yield name
    finally:
        async with pg_connection(endpoints.database_url) as conn:
            await conn.execute(f"DROP ROLE IF EXISTS {name}")


async def test_no_password_when_the_servers_refuse_it(
    endpoints: Endpoints, refused_role: str
) -> None:
    """The real servers refuse the login: the failure is told, the password is not."""
    env = _env(
        _database_on(endpoints.database_url, refused_role, ENCODED),
        _broker_on(endpoints.amqp_url, ENCODED),
    )
    expected = _everyone(1, "PostgreSQL")
    expected["service.produce"] = Expect(1, ("RabbitMQ", "PostgreSQL"))  # connects both first
    expected["service.declare"] = Expect(1, ("RabbitMQ",))  # needs the broker only
    expected["service.healthcheck"] = Expect(0)  # both servers answer
    assert await _run_every_command(env, expected) == []


async def test_no_password_when_the_broker_refuses_it(stack: Stack) -> None:
    """A good database and a refused broker password: those that need the broker say so."""
    env = _env(stack.database_url, _broker_on(stack.amqp_url, ENCODED))
    expected = _everyone(0)
    expected["service.produce"] = Expect(1, ("RabbitMQ",))
    expected["service.consume"] = Expect(1, ("RabbitMQ",))
    expected["service.declare"] = Expect(1, ("RabbitMQ",))
    expected["service.status"] = Expect(1, ("RabbitMQ cannot be reached",))
    assert await _run_every_command(env, expected) == []


async def test_status_with_the_broker_down_shows_no_password(stack: Stack) -> None:
    """status: the database answers, the broker does not; exit 1 and a redacted reason."""
    env = _env(stack.database_url, f"amqp://guest:{ENCODED}@{CLOSED}/")
    screen, machine = await asyncio.gather(
        asyncio.to_thread(run, "service.status", env=env),
        asyncio.to_thread(run, "service.status", "--json", env=env),
    )
    for result in (screen, machine):
        assert result.returncode == 1, result.stderr
        assert not [s for s in SHOWN_NEVER if s in result.stdout + result.stderr]
    assert screen.stdout.startswith("DOWN: RabbitMQ cannot be reached")
    [line] = [line for line in screen.stdout.splitlines() if line.startswith("- RabbitMQ")]
    assert "ConnectionError: cannot reach RabbitMQ at amqp://guest:***@" in line
    assert "ConnectionError" in json.loads(machine.stdout)["broker_error"]
