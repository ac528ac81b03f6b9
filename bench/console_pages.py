"""``python -m bench.console_pages``: how fast the console's pages render over many dead
letters (20,000 by default), in a database of its own (removed at the end).

It migrates a fresh database, inserts the dead letters (three error classes,
two give-up reasons, a tenth closed with their holds parked), starts
``python -m service.console`` on it, logs in and times, over repeated GETs
(median and max): the overview, the listing's first page, a page deep in the
listing (after the keyset cursor of the last row but one), a filtered page, and
one dead letter. Prints the figures; exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time

import asyncpg
import httpx

from bench.config import REPO, endpoints_from
from bench.sandbox import new_name
from service.adapters.postgres.databases import database_created
from service.console.auth import hash_password

PASSWORD = "bench-console-password"
SEED = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() - interval '1 hour' FROM generate_series(1, $1);
"""
SEED_DEAD = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker, status)
SELECT 'expire:' || r.id, r.id, r.hold_until,
       (ARRAY['db.unavailable', 'db.lock-timeout', 'poison.not-json'])[1 + n % 3],
       (ARRAY['attempts-exhausted', 'age-exhausted'])[1 + n % 2], 'bench', 10,
       now() - make_interval(secs => n), now() - make_interval(secs => n / 2.0), 'bench',
       CASE WHEN n % 10 = 0 THEN 'closed' ELSE 'dead' END
  FROM (SELECT id, hold_until, row_number() OVER () AS n FROM reservations) r
"""
PARK = """
INSERT INTO parked_holds (reservation_id, dead_letter_id)
SELECT reservation_id, id FROM dead_letters WHERE status = 'closed'
"""
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.console_pages", description=__doc__)
    p.add_argument("--dead-letters", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=20)
    return p


async def seed(url: str, count: int) -> None:
    """Migrate, then insert ``count`` dead letters (a tenth closed and parked)."""
    env = {**os.environ, "DATABASE_URL": url}
    migrate = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service.migrate", env=env, cwd=REPO
    )
    assert await migrate.wait() == 0
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(SEED, count)
        await conn.execute(SEED_DEAD)
        await conn.execute(PARK)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def timed(client: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, float]:
    """Median and max milliseconds of GET ``path`` (each answer must be 200)."""
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        answer = await client.get(path)
        samples.append((time.perf_counter() - began) * 1000)
        assert answer.status_code == 200, (path, answer.status_code)
    return statistics.median(samples), max(samples)


async def measure(url: str, amqp_url: str, args: argparse.Namespace) -> None:
    port = 18000 + os.getpid() % 1000
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")},
        "DATABASE_URL": url,
        "AMQP_URL": amqp_url,
        "EXPIRY_CONSOLE_PORT": str(port),
        "EXPIRY_CONSOLE_USERS": f"bench:{hash_password(PASSWORD)}",
        "EXPIRY_LOG_LEVEL": "WARNING",
    }
    console = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service.console", env=env, cwd=REPO
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            await _log_in(client)
            conn = await asyncpg.connect(url)
            try:
                row = await conn.fetchrow(
                    "SELECT id, last_seen FROM dead_letters WHERE status = 'dead'"
                    " ORDER BY last_seen, id OFFSET 1 LIMIT 1"
                )
            finally:
                await conn.close()
            assert row is not None
            deep = f"{row['last_seen'].isoformat()},{row['id']}"
            pages = {
                "overview": "/",
                "listing, first page": "/dead-letters",
                "listing, deepest page": f"/dead-letters?after={httpx.URL(deep)}",
                "listing, one class and reason": (
                    "/dead-letters?error_class=db.lock-timeout&give_up=age-exhausted"
                ),
                "one dead letter": f"/dead-letters/{row['id']}",
            }
            print(f"console pages over {args.dead_letters:,} dead letters ({args.repeat} GETs):")
            for label, path in pages.items():
                median, worst = await timed(client, path, args.repeat)
                print(f"  {label:32} median {median:6.1f} ms   max {worst:6.1f} ms")
    finally:
        console.terminate()
        await console.wait()


async def _log_in(client: httpx.AsyncClient) -> None:
    async with asyncio.timeout(30):
        while True:
            try:
                login = await client.get("/login")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.2)
    found = CSRF.search(login.text)
    assert found is not None
    data = {"csrf": found.group(1), "name": "bench", "password": PASSWORD}
    assert (await client.post("/login", data=data)).status_code == 303


async def main_async(args: argparse.Namespace) -> None:
    endpoints = endpoints_from(os.environ)
    async with database_created(endpoints.database_url, new_name()) as url:
        await seed(url, args.dead_letters)
        await measure(url, endpoints.amqp_url, args)


def main() -> None:
    """Entry point."""
    asyncio.run(main_async(parser().parse_args()))


if __name__ == "__main__":
    main()
