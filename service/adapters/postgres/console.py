"""The console's sessions and its login audit (``console_sessions``, ``console_logins``).

A session is found by the SHA-256 of its cookie's token, and only while it is open: not
ended, seen within the idle timeout, begun within the absolute one (the database's clock
decides both). Times go out as seconds since the epoch for the pure throttle.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from service.adapters.postgres.pool import Connection
from service.core.login_throttle import Attempt

START_SESSION = """
INSERT INTO console_sessions (token, operator, credential, csrf, device, client_host)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id
"""
# Found and touched in one statement, only while open.
TOUCH_SESSION = """
UPDATE console_sessions SET last_seen_at = now()
 WHERE token = $1 AND ended_at IS NULL
   AND last_seen_at > now() - make_interval(secs => $2)
   AND started_at > now() - make_interval(secs => $3)
RETURNING id, operator, credential, csrf
"""
END_SESSION_BY_TOKEN = """
UPDATE console_sessions SET ended_at = now(), ended_by = $2, end_reason = $3
 WHERE token = $1 AND ended_at IS NULL
"""
END_SESSIONS = """
UPDATE console_sessions SET ended_at = now(), ended_by = $3, end_reason = $4
 WHERE ended_at IS NULL AND (operator = ANY($1::text[]) OR id = ANY($2::bigint[]))
RETURNING id, operator
"""
OPEN_SESSIONS = """
SELECT id, operator, client_host, started_at, last_seen_at,
       extract(epoch FROM now() - started_at)::float8 AS age_seconds,
       extract(epoch FROM now() - last_seen_at)::float8 AS idle_seconds
  FROM console_sessions
 WHERE ended_at IS NULL
   AND last_seen_at > now() - make_interval(secs => $1)
   AND started_at > now() - make_interval(secs => $2)
 ORDER BY operator, started_at
 LIMIT 1000
"""
KNOWN_DEVICE = """
SELECT EXISTS (
  SELECT 1 FROM console_sessions
   WHERE device = $1 AND operator = $2 AND started_at > now() - make_interval(secs => $3))
"""
RECORD_LOGIN = """
INSERT INTO console_logins (name, known, client_host, device, outcome, detail)
VALUES ($1, $2, $3, $4, $5, $6)
"""
# What the throttle weighs: the checked attempts (failed or ok) on this name or from this
# address in its window (newest first, bounded), and the database's clock. Refused ones
# never count, and are left out here so that a flood of them, which costs an attacker
# nothing, cannot push the failures out of the bound.
RECENT_LOGINS = """
SELECT name, client_host, device, outcome, extract(epoch FROM at)::float8 AS at,
       extract(epoch FROM now())::float8 AS now
  FROM console_logins
 WHERE at > now() - make_interval(secs => $3) AND (name = $1 OR client_host = $2)
   AND outcome <> 'refused'
 ORDER BY at DESC
 LIMIT 5000
"""
LOGIN_NOW = "SELECT extract(epoch FROM now())::float8"
FAILED_LOGINS = """
SELECT at, name, known, client_host, outcome, detail
  FROM console_logins
 WHERE outcome <> 'ok' AND at > now() - make_interval(secs => $1)
 ORDER BY at DESC
 LIMIT $2
"""
FAILED_LOGIN_COUNT = """
SELECT count(*) FROM console_logins
 WHERE outcome <> 'ok' AND at > now() - make_interval(secs => $1)
"""


@dataclass(frozen=True)
class Session:
    """An open session, as a request finds it."""

    id: int
    operator: str
    credential: str
    csrf: str


async def start_session(
    conn: Connection,
    token: bytes,
    operator: str,
    credential: str,
    csrf: str,
    device: bytes | None,
    client: str,
) -> Session:
    """Begin a session (``token`` and ``device``: SHA-256 digests, never the cookies)."""
    found = await conn.fetchval(START_SESSION, token, operator, credential, csrf, device, client)
    return Session(int(found), operator, credential, csrf)


async def touch_session(
    conn: Connection, token: bytes, idle_seconds: float, max_seconds: float
) -> Session | None:
    """The open session of this token digest (its last-seen time moved to now), or None."""
    row = await conn.fetchrow(TOUCH_SESSION, token, idle_seconds, max_seconds)
    return None if row is None else Session(**dict(row))


async def end_session(conn: Connection, token: bytes, by: str, reason: str) -> None:
    """End the session of this token digest, if it is open."""
    await conn.execute(END_SESSION_BY_TOKEN, token, by, reason)


async def end_sessions(
    conn: Connection, operators: list[str], ids: list[int], by: str, reason: str
) -> list[asyncpg.Record]:
    """End every open session of ``operators`` and those numbered ``ids``; (id, operator)
    of each one ended."""
    return await conn.fetch(END_SESSIONS, operators, ids, by, reason)


async def open_sessions(
    conn: Connection, idle_seconds: float, max_seconds: float
) -> list[asyncpg.Record]:
    """The sessions that are open now (at most 1,000), by operator."""
    return await conn.fetch(OPEN_SESSIONS, idle_seconds, max_seconds)


async def known_device(conn: Connection, device: bytes, operator: str, seconds: float) -> bool:
    """Whether a session of ``operator`` began in this browser within ``seconds``."""
    return bool(await conn.fetchval(KNOWN_DEVICE, device, operator, seconds))


async def record_login(
    conn: Connection,
    name: str,
    *,
    known: bool,
    client: str,
    device: bool,
    outcome: str,
    detail: str | None = None,
) -> None:
    """Append one login attempt to the audit."""
    await conn.execute(RECORD_LOGIN, name, known, client, device, outcome, detail)


async def recent_logins(
    conn: Connection, name: str, client: str, seconds: float
) -> tuple[float, list[Attempt]]:
    """The database's time now, and the checked attempts on ``name`` or from ``client``
    within ``seconds`` (newest first, at most 5,000; refused ones are not weighed)."""
    rows = await conn.fetch(RECENT_LOGINS, name, client, seconds)
    now = rows[0]["now"] if rows else await conn.fetchval(LOGIN_NOW)
    logins = [
        Attempt(r["name"], r["client_host"], r["device"], r["outcome"], r["at"]) for r in rows
    ]
    return float(now), logins


async def failed_logins(
    conn: Connection, seconds: float, limit: int
) -> tuple[int, list[asyncpg.Record]]:
    """How many logins failed or were refused within ``seconds``, and the newest ``limit``."""
    count = await conn.fetchval(FAILED_LOGIN_COUNT, seconds)
    return int(count), await conn.fetch(FAILED_LOGINS, seconds, limit)
