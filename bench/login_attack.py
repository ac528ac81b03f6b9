"""``python -m bench.login_attack``: what an attacker gets past the console's login throttle.

Each attack has a ``python -m service.console`` (shipped throttle defaults) and a database
(``expiry_bench_login_<random>``, migrated, dropped afterwards) of its own, driven with httpx:
1. parallel: WORKERS browsers guess alice's password from 127.0.0.1 for SECONDS;
2. patient: one browser guesses bob's, waiting out each Retry-After, for SECONDS;
3. spray: one guess at each of user0..user99 (user7 exists), WORKERS at a time;
4. distributed: WORKERS browsers guess alice's for SECONDS, each from its own loopback
   address (127.0.0.2, ...), which the console sees as its client.
``--before PATH`` runs attack 1 on another checkout (its own migrate and console, this
interpreter). One line of figures per attack, or JSON (``--json``); nothing fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.config import REPO, endpoints_from
from service.adapters.postgres.databases import database_created
from service.console.auth import hash_password
from service.core.login_throttle import Attempt, Policy, Trial, decide
from service.settings import Settings

PASSWORDS = {"alice": "alice-right-password", "bob": "bob-right-password", "user7": "x" * 16}
SECRET = "bench-login-attack-secret-0123456789abcdef"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
LONGEST = 60.0  # a Retry-After above the throttle's longest delay is a lock
DAY = 86400.0
INF = float("inf")
DEFAULTS = Settings.model_fields
POLICY = Policy(
    DEFAULTS["console_login_attempts"].default, DEFAULTS["console_login_lock_seconds"].default
)
Figures = dict[str, float | int | bool | str | None]
_USERS: list[str] = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_seconds(database: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving ``database``, by pid."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError):
            if f" {database} ".encode() in (proc / "cmdline").read_bytes():
                found[int(proc.name)] = cpu_seconds(int(proc.name))
    return found


def machine_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the machine, all cores."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def log_errors(log: Path) -> int:
    """Lines of the console's log that report an error or a traceback."""
    return sum("ERROR" in line or "Traceback" in line for line in log.read_text().splitlines())


def revision(checkout: Path) -> str:
    """The commit checked out at ``checkout`` (``+modified`` if ``service/`` differs)."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "service"], capture_output=True)
    return head.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")


@dataclass(frozen=True)
class Console:
    """A running console: its URL, process and log."""

    base: str
    pid: int
    log: Path
    database: str

    def client(self, source: str | None = None) -> httpx.AsyncClient:
        """A browser: its own cookie jar, no redirects followed, from ``source`` if given."""
        transport = httpx.AsyncHTTPTransport(local_address=source) if source else None
        return httpx.AsyncClient(base_url=self.base, timeout=120, transport=transport)


@contextlib.asynccontextmanager
async def console_on(checkout: Path, admin_url: str, amqp_url: str) -> AsyncIterator[Console]:
    """``python -m service.console`` of ``checkout`` on a fresh, migrated database."""
    if not _USERS:
        _USERS.extend(f"{name}:{hash_password(pw)}" for name, pw in PASSWORDS.items())
    database = f"expiry_bench_login_{secrets.token_hex(4)}"
    async with database_created(admin_url, database) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
        env.update(DATABASE_URL=url, AMQP_URL=amqp_url, PYTHONPATH=str(checkout))
        migrate = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service.migrate", env=env, cwd=checkout,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if await migrate.wait() != 0:
            raise RuntimeError(f"service.migrate of {checkout} exited {migrate.returncode}")
        port = free_port()
        env.update(
            EXPIRY_CONSOLE_PORT=str(port), EXPIRY_CONSOLE_USERS=",".join(_USERS),
            EXPIRY_CONSOLE_SECRET=SECRET, EXPIRY_REPLAY_OPERATORS="alice,bob",
        )  # fmt: skip
        out, log = tempfile.mkstemp(prefix="login_attack_", suffix=".log")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service.console", env=env, cwd=checkout,
            stdout=out, stderr=out,
        )  # fmt: skip
        os.close(out)
        console = Console(f"http://127.0.0.1:{port}", process.pid, Path(log), database)
        try:
            async with asyncio.timeout(30), console.client() as probe:
                while process.returncode is None:
                    with contextlib.suppress(httpx.TransportError):
                        if (await probe.get("/login")).status_code == 200:
                            break
                    await asyncio.sleep(0.2)
            if process.returncode is not None:
                raise RuntimeError(f"the console exited {process.returncode}: see {log}")
            yield console
            console.log.unlink()  # kept when something went wrong
        finally:
            process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 15)
            if process.returncode is None:
                process.kill()
                await process.wait()


async def form_token(browser: httpx.AsyncClient) -> str:
    """The login form's CSRF token for this browser."""
    found = CSRF.search((await browser.get("/login")).text)
    if found is None:
        raise RuntimeError("no login form on /login")
    return found.group(1)


async def log_in(browser: httpx.AsyncClient, name: str) -> tuple[httpx.Response, float]:
    """Log ``name`` in with the right password from a fresh form: the answer, seconds taken."""
    began = time.monotonic()
    data = {"csrf": await form_token(browser), "name": name, "password": PASSWORDS[name]}
    answer = await browser.post("/login", data=data)
    return answer, time.monotonic() - began


def retry_after(answer: httpx.Response) -> float:
    """The answer's Retry-After in seconds (0 without one)."""
    return float(answer.headers.get("retry-after", 0))


def ms(seconds: list[float]) -> float | None:
    """Their median in milliseconds."""
    return round(1000 * statistics.median(seconds), 1) if seconds else None


@dataclass
class Tally:
    """Every guess: (sent, answered: seconds since the start; status; Retry-After)."""

    start: float = field(default_factory=time.monotonic)
    seen: list[tuple[float, float, int, float]] = field(default_factory=list)
    errors: int = 0  # transport errors

    def add(self, sent: float, answer: httpx.Response) -> None:
        now = time.monotonic() - self.start
        self.seen.append((sent - self.start, now, answer.status_code, retry_after(answer)))

    def figures(self, seconds: float) -> Figures:
        """Attempts, checked (401), refused (429), rates, the first refusal and lock, and how
        long refusals took at the start and at the end."""
        checked = [sent for sent, _, status, _ in self.seen if status == 401]
        refused = [(sent, done) for sent, done, status, _ in self.seen if status == 429]
        locks = [done for _, done, status, wait in self.seen if status == 429 and wait > LONGEST]
        end = max((done for _, done, _, _ in self.seen), default=0.0)
        return {
            "attempts": len(self.seen), "checked": len(checked), "refused": len(refused),
            "checked_per_s": round(len(checked) / seconds, 3),
            "checked_sent_first_s": sum(sent <= 1.0 for sent in checked),
            "checked_after_lock": sum(sent > min(locks) for sent in checked) if locks else 0,
            "first_429_s": round(min(done for _, done in refused), 3) if refused else None,
            "lock_s": round(min(locks), 3) if locks else None,
            "refused_ms_first_5s": ms([d - s for s, d in refused if d <= 5]),
            "refused_ms_last_5s": ms([d - s for s, d in refused if d >= end - 5]),
            "other_status": sum(status not in (401, 429) for _, _, status, _ in self.seen),
            "transport_errors": self.errors,
        }  # fmt: skip


async def guess(
    browser: httpx.AsyncClient, tally: Tally, names: list[str], until: float, *,
    patient: bool = False,
) -> None:  # fmt: skip
    """Wrong passwords as fast as answered (``patient``: waiting out each Retry-After): at
    ``names[0]`` until ``until``, or at each of ``names`` once (taken off the shared list)
    when ``until`` is infinite."""
    token, n = await form_token(browser), 0
    while names and time.monotonic() < until:
        name = names[0] if until != INF else names.pop()
        n += 1
        data = {"csrf": token, "name": name, "password": f"wrong-{secrets.token_hex(4)}-{n}"}
        try:
            sent = time.monotonic()
            answer = await browser.post("/login", data=data)
        except httpx.TransportError:
            tally.errors += 1
            continue
        tally.add(sent, answer)
        token = found.group(1) if (found := CSRF.search(answer.text)) else token
        if patient and answer.status_code == 429:
            await asyncio.sleep(min(retry_after(answer), max(until - time.monotonic(), 0)))


async def metered(console: Console, work: Awaitable[object]) -> Figures:
    """CPU during ``work`` (% of one core) of the console, PostgreSQL and this benchmark,
    and how busy the machine was (% of all its cores)."""
    began, mine, busy = time.monotonic(), time.process_time(), machine_ticks()
    console_cpu, postgres_cpu = cpu_seconds(console.pid), postgres_seconds(console.database)
    await work
    wall, after, postgres = (
        time.monotonic() - began,
        machine_ticks(),
        postgres_seconds(console.database),
    )
    postgres_used = sum(postgres[pid] - postgres_cpu.get(pid, 0.0) for pid in postgres)
    return {
        "console_cpu_pct": round(100 * (cpu_seconds(console.pid) - console_cpu) / wall, 1),
        "postgres_cpu_pct": round(100 * postgres_used / wall, 1),
        "bench_cpu_pct": round(100 * (time.process_time() - mine) / wall, 1),
        "machine_busy_pct": round(100 * (after[0] - busy[0]) / max(after[1] - busy[1], 1), 1),
    }


async def aftermath(console: Console, device: httpx.AsyncClient) -> Figures:
    """alice's right password from a fresh browser at 127.0.0.1, and from ``device`` (a
    browser that logged her in before the attack and so holds her device cookie)."""
    async with console.client() as fresh:
        answer, _ = await log_in(fresh, "alice")
    again, seconds = await log_in(device, "alice")
    return {
        "right_pw_refused": answer.status_code == 429, "right_pw_status": answer.status_code,
        "right_pw_retry_after": retry_after(answer), "device_gets_in": again.status_code == 303,
        "device_login_s": round(seconds, 3),
    }  # fmt: skip


async def flood(
    console: Console, args: argparse.Namespace, names: list[str], seconds: float, *,
    spread: bool = False, beside: Awaitable[object] | None = None,
) -> Figures:  # fmt: skip
    """WORKERS browsers guessing (``guess``), from 127.0.0.1 or (``spread``) each from its
    own address 127.0.0.2, ...; alice's device browser logs in before and tries after."""
    async with console.client() as device, contextlib.AsyncExitStack() as stack:
        assert (await log_in(device, "alice"))[0].status_code == 303
        sources = [f"127.0.0.{2 + i}" if spread else None for i in range(args.workers)]
        browsers = [await stack.enter_async_context(console.client(s)) for s in sources]
        tally = Tally()
        guesses = (guess(b, tally, names, tally.start + seconds) for b in browsers)
        cpu = await metered(console, asyncio.gather(*guesses, *([beside] if beside else [])))
        figures = tally.figures(time.monotonic() - tally.start) | cpu
        return figures | await aftermath(console, device)


async def parallel(console: Console, args: argparse.Namespace) -> Figures:
    """Attack 1, while bob logs in from a fresh browser at 127.0.0.1 every SECONDS/6."""
    async with console.client() as idle:
        idle_s = (await log_in(idle, "bob"))[1]
    legit: list[tuple[int, float]] = []

    async def bob() -> None:
        until = time.monotonic() + args.seconds
        while (pause := min(args.seconds / 6, until - time.monotonic())) > 0:
            await asyncio.sleep(pause)
            async with console.client() as fresh:
                answer, seconds = await log_in(fresh, "bob")
            legit.append((answer.status_code, seconds))

    figures = await flood(console, args, ["alice"], args.seconds, beside=bob())
    return {"policy_max": projected(args.seconds, 1)} | figures | {
        "bob_idle_login_s": round(idle_s, 3),
        "bob_flood_login_max_s": round(max((s for _, s in legit), default=0.0), 3),
        "bob_flood_logins": len(legit),
        "bob_flood_logins_ok": sum(status == 303 for status, _ in legit),
    }  # fmt: skip


async def patient(console: Console, args: argparse.Namespace) -> Figures:
    """Attack 2: one browser at bob, sleeping each Retry-After out."""
    tally = Tally()
    async with console.client() as browser:
        await guess(browser, tally, ["bob"], tally.start + args.seconds, patient=True)
    return {"policy_max": projected(args.seconds, 1)} | tally.figures(args.seconds) | {
        "policy_per_hour": projected(3600, 1), "policy_per_day": projected(DAY, 1),
    }  # fmt: skip


async def spray(console: Console, args: argparse.Namespace) -> Figures:
    """Attack 3: one guess at each of 100 names, WORKERS at a time, from 127.0.0.1."""
    return await flood(console, args, [f"user{i}" for i in reversed(range(100))], INF)


async def distributed(console: Console, args: argparse.Namespace) -> Figures:
    """Attack 4: alice's password from WORKERS addresses; her fresh and device browsers stay
    at 127.0.0.1, which never guesses."""
    figures = await flood(console, args, ["alice"], args.seconds, spread=True)
    return {"policy_max": projected(args.seconds, args.workers)} | figures | {
        "policy_per_hour": projected(3600, args.workers),
        "policy_per_day": projected(DAY, args.workers),
    }  # fmt: skip


def projected(seconds: float, addresses: int) -> int:
    """Guesses checked in ``seconds`` at one name from ``addresses`` addresses by attackers
    who wait out every refusal (the shipped policy's arithmetic; checks take no time)."""
    now, recent, count = 0.0, list[Attempt](), 0
    while True:
        trials = [Trial("alice", f"a{i}", device=False) for i in range(addresses)]
        wait, trial = min(
            ((decide(POLICY, t, recent, now).wait_seconds, t) for t in trials),
            key=lambda pair: pair[0],
        )
        now += max(wait, 0.0)
        if now >= seconds:
            return count
        recent = [a for a in recent if now - a.at < POLICY.lock_seconds]
        recent.append(Attempt("alice", trial.client, False, "failed", now))
        count += 1


Attack = Callable[[Console, argparse.Namespace], Awaitable[Figures]]
ATTACKS: dict[str, Attack] = {
    "parallel": parallel, "patient": patient, "spray": spray, "distributed": distributed
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.login_attack", description=__doc__)
    add = p.add_argument
    add("--seconds", type=float, default=30.0, help="length of the timed attacks (30)")
    add("--workers", type=int, default=20, help="parallel browsers (20)")
    add("--only", choices=list(ATTACKS), action="append", help="these attacks only")
    add("--before", type=Path, help="a checkout to run instead (attack 1 unless --only)")
    add("--json", action="store_true", help="one JSON object instead of lines")
    return p


async def main_async(args: argparse.Namespace) -> None:
    """Each attack on a console and database of its own; the figures."""
    endpoints, checkout = endpoints_from(os.environ), (args.before or REPO).resolve()
    chosen = args.only or (["parallel"] if args.before else list(ATTACKS))
    report: dict[str, Figures] = {}
    head = f"code {checkout} @ {revision(checkout)}: {args.workers} workers, {args.seconds:g} s"
    if not args.json:
        policy = f"; policy {POLICY.attempts} failures, lock {POLICY.lock_seconds:g} s"
        print(head + ("" if args.before else policy))
    for name in chosen:
        async with console_on(checkout, endpoints.database_url, endpoints.amqp_url) as console:
            report[name] = await ATTACKS[name](console, args)
            report[name]["console_log_errors"] = log_errors(console.log)
        if not args.json:
            print(f"{name}: " + " ".join(f"{k}={v}" for k, v in report[name].items()), flush=True)
    if args.json:
        print(json.dumps({"code": head, "attacks": report}, indent=2))


def main() -> None:
    """Entry point."""
    asyncio.run(main_async(parser().parse_args()))


if __name__ == "__main__":
    main()
