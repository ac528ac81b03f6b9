"""The invariant every scenario ends with, checked independently of the service.

A trigger that the test installs counts every status change (and any delete)
of ``reservations`` into ``fault_transitions``; the check reads that table,
the rows themselves and the queues:

- every due hold that the support side did not consume (and that is not an
  expected dead letter) is ``expired``, with exactly one transition;
- no consumed hold was expired; no future hold was touched; nothing left a
  final state, nothing was deleted;
- the service's own audit trail agrees with the trigger, and the service's
  own proof (``python -m service.verify``) finds no violation;
- the work queue, every delay queue and any other queue of the service but
  ``expirations.dead`` are empty;
- the dead-letter queue holds exactly the expected commands, once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import aio_pika
import aiormq.exceptions
import asyncpg

from service.adapters.amqp.queues import queue_counts
from service.adapters.postgres.databases import admin_sql
from tests.support import drain_queue

if TYPE_CHECKING:
    from tests.faults.world import World


def transition_trigger(prefix: str) -> str:
    """SQL that installs a trigger counting every status change (and any delete) of
    ``reservations`` into ``<prefix>_transitions`` (the cluster test uses it too)."""
    return f"""
CREATE TABLE {prefix}_transitions (
    id              bigserial PRIMARY KEY,
    reservation_id  uuid NOT NULL,
    from_status     text NOT NULL,
    to_status       text NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid            bigint NOT NULL DEFAULT txid_current(),
    application     text NOT NULL DEFAULT current_setting('application_name')
);

CREATE FUNCTION {prefix}_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {prefix}_transitions (reservation_id, from_status, to_status)
        VALUES (OLD.id, OLD.status, 'deleted');
        RETURN OLD;
    END IF;
    INSERT INTO {prefix}_transitions (reservation_id, from_status, to_status)
    VALUES (NEW.id, OLD.status, NEW.status);
    RETURN NEW;
END;
$$;

CREATE TRIGGER {prefix}_transitions_on_update AFTER UPDATE ON reservations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {prefix}_record_transition();
CREATE TRIGGER {prefix}_transitions_on_delete AFTER DELETE ON reservations
    FOR EACH ROW EXECUTE FUNCTION {prefix}_record_transition();
"""


TRIGGER_SQL = transition_trigger("fault")

STATE_SQL = """
SELECT r.id, r.status, r.updated_at = r.created_at AS untouched,
       coalesce(t.to_expired, 0) AS to_expired,
       coalesce(t.to_consumed, 0) AS to_consumed,
       coalesce(t.total, 0) AS total,
       coalesce(t.from_final, 0) AS from_final,
       coalesce(a.audited, 0) AS audited
  FROM reservations r
  LEFT JOIN (SELECT reservation_id,
                    count(*) FILTER (WHERE to_status = 'expired') AS to_expired,
                    count(*) FILTER (WHERE to_status = 'consumed') AS to_consumed,
                    count(*) FILTER (WHERE from_status <> 'held') AS from_final,
                    count(*) AS total
               FROM fault_transitions GROUP BY 1) t ON t.reservation_id = r.id
  LEFT JOIN (SELECT reservation_id, count(*) AS audited
               FROM reservation_transitions WHERE to_status = 'expired' GROUP BY 1) a
         ON a.reservation_id = r.id
"""

DELETED_SQL = "SELECT reservation_id FROM fault_transitions WHERE to_status = 'deleted'"

DEAD_QUEUE = "expirations.dead"

STILL_DUE_SQL = """
SELECT count(*) FROM reservations
 WHERE status = 'held' AND hold_until <= now() AND NOT (id = ANY($1::uuid[]))
"""


async def install_transition_trigger(url: str) -> None:
    """Install the independent transition counter in a migrated database."""
    await admin_sql(url, TRIGGER_SQL)


@dataclass
class Expectation:
    """What the end state must be."""

    due: set[UUID]
    future: set[UUID]
    consumed: set[UUID] = field(default_factory=set)  # the support side won these
    dead: set[UUID] = field(default_factory=set)  # must end in expirations.dead, still held


@dataclass
class Outcome:
    """What the check found, for the figures."""

    expired: int
    consumed: int
    dead_letters: list[aio_pika.abc.AbstractIncomingMessage]


@dataclass(frozen=True)
class _Row:
    status: str
    untouched: bool
    to_expired: int
    to_consumed: int
    total: int
    from_final: int
    audited: int


async def _rows(url: str) -> tuple[dict[UUID, _Row], list[UUID]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(STATE_SQL)
        deleted = [row["reservation_id"] for row in await conn.fetch(DELETED_SQL)]
    finally:
        await conn.close()
    state = {
        row["id"]: _Row(
            row["status"],
            row["untouched"],
            row["to_expired"],
            row["to_consumed"],
            row["total"],
            row["from_final"],
            row["audited"],
        )
        for row in rows
    }
    return state, deleted


def _violations(state: dict[UUID, _Row], deleted: list[UUID], expect: Expectation) -> list[str]:
    problems: list[str] = []

    def check(what: str, ids: list[UUID]) -> None:
        if ids:
            problems.append(f"{len(ids)} {what}, e.g. {[str(i) for i in ids[:3]]}")

    must_expire = expect.due - expect.consumed - expect.dead
    missing = [i for i in expect.due | expect.future if i not in state]
    check("reservations missing", missing + deleted)
    check(
        "due holds not expired exactly once",
        [
            i
            for i in must_expire
            if i in state
            and (state[i].status, state[i].to_expired, state[i].total) != ("expired", 1, 1)
        ],
    )
    check(
        "consumed holds not left consumed",
        [
            i
            for i in expect.consumed
            if i in state
            and (state[i].status, state[i].to_expired, state[i].to_consumed) != ("consumed", 0, 1)
        ],
    )
    check(
        "future holds touched",
        [
            i
            for i in expect.future - expect.consumed
            if i in state
            and (state[i].status, state[i].total, state[i].untouched) != ("held", 0, True)
        ],
    )
    check(
        "expected dead letters not left held",
        [i for i in expect.dead if i in state and (state[i].status, state[i].total) != ("held", 0)],
    )
    check("transitions out of a final state", [i for i, r in state.items() if r.from_final])
    check(
        "audit rows that disagree with the trigger",
        [i for i, r in state.items() if r.audited != r.to_expired],
    )
    return problems


async def queue_depths(amqp_url: str, queues: list[str]) -> dict[str, int] | None:
    """Ready messages per queue (passive declares), or None if the broker does not answer."""
    try:
        connection = await aio_pika.connect(amqp_url, timeout=5)
    except (OSError, aiormq.exceptions.AMQPError, TimeoutError):
        return None
    depths: dict[str, int] = {}
    try:
        channel = await connection.channel()
        for name in queues:
            depths[name] = (await queue_counts(channel, name)).ready
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return depths


async def consumer_count(amqp_url: str, queue: str = "expirations") -> int:
    """Consumers attached to ``queue`` (0 if it does not exist or the broker is away)."""
    try:
        connection = await aio_pika.connect(amqp_url, timeout=5)
    except (OSError, aiormq.exceptions.AMQPError, TimeoutError):
        return 0
    try:
        return (await queue_counts(await connection.channel(), queue)).consumers
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError):
        return 0
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def wait_for_consumers(amqp_url: str, count: int, timeout: float = 60.0) -> None:
    """Wait until exactly ``count`` consumers are attached to the work queue."""
    async with asyncio.timeout(timeout):
        while await consumer_count(amqp_url) != count:
            await asyncio.sleep(0.2)


async def still_due(url: str, excluded: set[UUID]) -> int | None:
    """Due holds still held (not counting ``excluded``), or None if the database is away."""
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        return None
    try:
        value: int = await conn.fetchval(STILL_DUE_SQL, list(excluded))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None
    finally:
        conn.terminate()
    return value


async def work_queues(world: World) -> list[str]:
    """Every queue of the world's vhost that must end empty: all but the dead letters."""
    names = set(await world.management.queue_names(world.vhost))
    names.update(["expirations", *world.retry_queues])
    return sorted(names - {DEAD_QUEUE})


async def settle(world: World, expect: Expectation, timeout: float) -> bool:
    """Wait until no work is left: no due hold still held (but expected dead letters),
    and every queue but the dead letters empty, on two looks in a row.

    Returns False when that did not happen within ``timeout`` seconds: the check that
    follows then says what is wrong.
    """
    quiet = 0
    try:
        async with asyncio.timeout(timeout):
            while quiet < 2:
                await asyncio.sleep(0.5)
                depths = await queue_depths(world.amqp_url, await work_queues(world))
                due = await still_due(world.database_url, expect.dead)
                idle = depths is not None and not any(depths.values()) and due == 0
                quiet = quiet + 1 if idle else 0
    except TimeoutError:
        return False
    return True


def reservation_of(message: aio_pika.abc.AbstractIncomingMessage) -> str:
    """The reservation id a command names, or ``<unreadable>``."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        body: Any = json.loads(message.body)
        return str(body["reservation_id"])
    return "<unreadable>"


async def service_verify(world: World) -> list[str]:
    """The service's own proof, ``python -m service.verify``, as a second opinion."""
    process = await world.fleet.run("service.verify", "--json", name="verify", env=world.env())
    if process.returncode == 0:
        return []
    return [f"python -m service.verify exited {process.returncode}: {process.text()[-1500:]}"]


async def verify(world: World, expect: Expectation, *, settled: bool = True) -> Outcome:
    """Check the invariant (see the module docstring); return the figures it found.

    Call it once every consumer has stopped, so nothing is unacked.
    """
    state, deleted = await _rows(world.database_url)
    problems = _violations(state, deleted, expect)
    if not settled:
        problems.append("the work did not settle in time")
    depths = await queue_depths(world.amqp_url, await work_queues(world))
    assert depths is not None, "the broker does not answer"
    if any(depths.values()):
        problems.append(f"queues not drained: { {k: v for k, v in depths.items() if v} }")
    dead = await drain_queue(world.amqp_url, DEAD_QUEUE)
    found = Counter(reservation_of(m) for m in dead)
    wanted = Counter(str(i) for i in expect.dead)
    if found != wanted:
        unexpected, missing = sorted((found - wanted).elements()), sorted(wanted - found)
        problems.append(
            f"{len(unexpected)} unexpected dead letters, e.g. {unexpected[:3]}; "
            f"{len(missing)} expected ones missing, e.g. {missing[:3]}"
        )
    problems += await service_verify(world)
    assert not problems, "invariant violated:\n  " + "\n  ".join(problems)
    expired = sum(1 for r in state.values() if r.status == "expired")
    consumed = sum(1 for r in state.values() if r.status == "consumed")
    return Outcome(expired=expired, consumed=consumed, dead_letters=dead)
