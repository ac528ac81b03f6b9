"""Retention through the real database: weekly partitions made ahead and dropped behind as
the clock moves (passed in, not waited for), the kept window untouched, the audit still
refusing single-row DELETE and TRUNCATE, each drop recorded, two runs at once, a run
interrupted, a run during consumers and scans, and an existing database moved over."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from service.adapters.postgres import partitions as store
from service.adapters.postgres.databases import create_database, drop_database
from service.adapters.postgres.schema import migrate
from service.core.weeks import AUDIT_TABLES, WEEK, week_of
from service.ops import housekeeping
from service.ops.verification import verify
from service.scan import once as scan
from tests import support

# one_broker: PostgreSQL's partitions and the audit trail: the consumers and scans beside them
# are the pipeline's, tested on every broker version.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker]

DAY = timedelta(days=1)


async def _now(conn: asyncpg.Connection[asyncpg.Record]) -> datetime:
    value: datetime = await conn.fetchval("SELECT now()")
    return value


async def _partitions(conn: asyncpg.Connection[asyncpg.Record], table: str) -> list[str]:
    listed = await store.list_partitions(conn)
    return [p.name for p in listed.partitions if p.table == table]


async def _expired_at(
    conn: asyncpg.Connection[asyncpg.Record], at: datetime, count: int
) -> list[uuid.UUID]:
    """``count`` holds expired at ``at`` as the consumer leaves them (the week's partition
    made first, as retention would have made it then)."""
    low = week_of(at)
    await conn.execute(
        "SELECT expiry_make_partition($1, $2, $3)", "reservation_transitions", low, low + WEEK
    )
    ids = [uuid.uuid4() for _ in range(count)]
    await conn.execute(
        "INSERT INTO reservations (id, status, hold_until, created_at, updated_at)"
        " SELECT id, 'expired', $2, $2, $2 FROM unnest($1::uuid[]) AS id",
        ids,
        at - timedelta(seconds=1),
    )
    await conn.execute(
        "INSERT INTO reservation_transitions (reservation_id, from_status, to_status, at, worker)"
        " SELECT id, 'held', 'expired', $2, 'w' FROM unnest($1::uuid[]) AS id",
        ids,
        at,
    )
    return ids


async def _transitions_of(conn: asyncpg.Connection[asyncpg.Record], ids: list[uuid.UUID]) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM reservation_transitions WHERE reservation_id = ANY($1::uuid[])", ids
    )
    return count


async def test_weeks_are_made_ahead_and_dropped_behind_as_the_clock_moves(
    stack: support.Stack,
) -> None:
    """At the migration, four weeks ahead; a run at a later clock makes the weeks up to
    it plus EXPIRY_RETENTION_AHEAD_DAYS, and drops the weeks wholly past the retention,
    recording each (range, rows, who); rows of the kept weeks stay, verify proves them
    and says where its window begins."""
    settings = stack.settings
    async with support.pg_connection(stack.database_url) as conn:
        now = await _now(conn)
        assert (await store.list_partitions(conn)).partitions
        reach = max(p.high for p in (await store.list_partitions(conn)).partitions)
        assert reach >= now + timedelta(days=28)

        old = await _expired_at(conn, now - 100 * DAY, 30)
        middle = await _expired_at(conn, now - 50 * DAY, 20)
        recent = await _expired_at(conn, now - 1 * DAY, 10)

        first = await housekeeping.run(conn, settings, say=lambda _line: None)
        assert first.dropped == 1
        assert first.dropped_rows == 30
        assert await _transitions_of(conn, old) == 0
        assert await _transitions_of(conn, middle) == 20
        assert await _transitions_of(conn, recent) == 10
        dropped = await conn.fetch(
            "SELECT * FROM retention_actions WHERE action = 'dropped' ORDER BY id"
        )
        assert [(r["table_name"], r["rows"]) for r in dropped] == [("reservation_transitions", 30)]
        assert dropped[0]["range_from"] == week_of(now - 100 * DAY)
        assert dropped[0]["range_to"] == week_of(now - 100 * DAY) + WEEK
        assert dropped[0]["db_user"]
        assert dropped[0]["client_host"]

        verdict = await verify(conn, limit=5, scan_interval=settings.scan_interval_seconds)
        assert not verdict.failed, verdict.lines()
        assert verdict.since == week_of(now - 50 * DAY)
        assert verdict.totals["expired_before_window"] == 30
        assert "window: holds due since" in "\n".join(verdict.lines())

        later = now + 60 * DAY  # the clock moved two months on
        second = await housekeeping.run(conn, settings, now=later, say=lambda _line: None)
        assert second.dropped_rows == 20
        assert await _transitions_of(conn, middle) == 0
        assert await _transitions_of(conn, recent) == 10
        listed = await store.list_partitions(conn)
        for table in AUDIT_TABLES:
            mine = [p for p in listed.partitions if p.table == table]
            assert max(p.high for p in mine) >= later + timedelta(days=28), table
            assert min(p.low for p in mine) >= later - timedelta(days=90) - WEEK, table
            highs = sorted(p.high for p in mine)
            lows = sorted(p.low for p in mine)
            assert lows[1:] == highs[:-1], f"{table}: a gap or an overlap"

        again = await housekeeping.run(conn, settings, now=later, say=lambda _line: None)
        assert (again.made, again.dropped, again.pruned) == (0, 0, {})


async def _sent_at(
    conn: asyncpg.Connection[asyncpg.Record], ids: list[uuid.UUID], at: datetime
) -> None:
    """The pending events of ``ids`` marked sent at ``at`` (its week made first)."""
    low = week_of(at)
    await conn.execute(
        "SELECT expiry_make_partition($1, $2, $3)", "expiry_events_sent", low, low + WEEK
    )
    await conn.execute(
        "WITH sent AS (DELETE FROM expiry_events WHERE reservation_id = ANY($1::uuid[])"
        "  RETURNING id, reservation_id, message_id, expired_at, created_at)"
        " INSERT INTO expiry_events_sent"
        "  (id, reservation_id, message_id, expired_at, created_at, claims, relay, at)"
        " SELECT id, reservation_id, message_id, expired_at, created_at, 1, 'r', $2 FROM sent",
        ids,
        at,
    )


async def _rows_of(conn: asyncpg.Connection[asyncpg.Record], table: str) -> int:
    count: int = await conn.fetchval(f"SELECT count(*) FROM {table}")
    return count


async def test_sent_events_go_a_week_at_a_time_and_pending_ones_stay(
    stack: support.Stack,
) -> None:
    """Sent events are dropped by the week they were sent in, with the audit trail, each
    drop recorded; pending events stay, however old; and verify, comparing expiries and
    events where both are kept, is fooled neither by a sent event whose expiry's week is
    gone nor by the weeks each table lost (the outbox here as old as the oldest week)."""
    settings = stack.settings
    async with support.pg_connection(stack.database_url) as conn:
        now = await _now(conn)
        await conn.execute(
            "UPDATE schema_migrations SET applied_at = now() - interval '200 days'"
            " WHERE version = '0014_events'"
        )
        both_gone = await _expired_at(conn, now - 100 * DAY, 4)
        expiry_gone = await _expired_at(conn, now - 100 * DAY, 3)
        kept = await _expired_at(conn, now - 50 * DAY, 2)
        await _expired_at(conn, now - 1 * DAY, 5)  # their events stay pending
        await _sent_at(conn, both_gone, now - 100 * DAY + timedelta(minutes=1))
        await _sent_at(conn, expiry_gone, now - 85 * DAY)  # a relay down for two weeks
        await _sent_at(conn, kept, now - 50 * DAY)
        listed = await store.list_partitions(conn)
        sent_weeks = [p for p in listed.partitions if p.table == "expiry_events_sent"]
        assert max(p.high for p in sent_weeks) >= now + timedelta(days=28)  # made ahead
        before = await verify(conn, limit=5, scan_interval=settings.scan_interval_seconds)
        assert not before.failed, before.lines()

        report = await housekeeping.run(conn, settings, say=lambda _line: None)
        dropped = await conn.fetch(
            "SELECT table_name, rows FROM retention_actions WHERE action = 'dropped' ORDER BY 1"
        )
        assert [tuple(row) for row in dropped] == [
            ("expiry_events_sent", 4),
            ("reservation_transitions", 7),
        ]
        assert report.dropped_rows == 11
        assert await _rows_of(conn, "expiry_events_sent") == 5  # the later weeks stay
        assert await _rows_of(conn, "expiry_events") == 5  # pending: never dropped
        after = await verify(conn, limit=5, scan_interval=settings.scan_interval_seconds)
        assert not after.failed, after.lines()
        assert after.events is not None
        assert after.events.since == week_of(now - 50 * DAY)  # both tables hold it whole
        assert (after.events.sent, after.events.pending) == (5, 5)

        await conn.execute("UPDATE expiry_events SET created_at = now() - interval '200 days'")
        later = now + 100 * DAY  # the clock moved on: the rest of the sent weeks go too
        await housekeeping.run(conn, settings, now=later, say=lambda _line: None)
        assert await _rows_of(conn, "expiry_events_sent") == 0
        assert await _rows_of(conn, "expiry_events") == 5
        retained = {t.name: t for t in (await store.retained(conn)).tables}
        assert {"expiry_events", "expiry_events_sent"} <= set(retained)
        assert retained["expiry_events"].since is None  # not partitioned: all of it is kept


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM reservation_transitions WHERE worker = 'w'",
        "UPDATE reservation_transitions SET worker = 'x'",
        "TRUNCATE reservation_transitions",
        "TRUNCATE {partition}",
        "DELETE FROM {partition}",
        "TRUNCATE dead_letter_events",
        "TRUNCATE console_logins",
        "DELETE FROM retention_actions",
        "TRUNCATE retention_actions",
    ],
)
async def test_the_audit_still_refuses_rows_going_even_to_its_owner(
    stack: support.Stack, statement: str
) -> None:
    """Retention drops whole weeks; a row, a partition's rows or a table's rows cannot go."""
    async with support.pg_connection(stack.database_url) as conn:
        now = await _now(conn)
        await _expired_at(conn, now, 3)
        await housekeeping.run(conn, stack.settings, now=now + 21 * DAY, say=lambda _line: None)
        assert await conn.fetchval("SELECT count(*) FROM retention_actions") > 0
        partition = (await _partitions(conn, "reservation_transitions"))[0]
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute(statement.format(partition=f'"{partition}"'))


async def test_two_runs_at_once_make_and_drop_each_week_once(stack: support.Stack) -> None:
    async with (
        support.pg_connection(stack.database_url) as first,
        support.pg_connection(stack.database_url) as second,
    ):
        now = await _now(first)
        await _expired_at(first, now - 120 * DAY, 5)
        later = now + 21 * DAY
        reports = await asyncio.gather(
            housekeeping.run(first, stack.settings, now=later, say=lambda _line: None),
            housekeeping.run(second, stack.settings, now=later, say=lambda _line: None),
        )
        assert sum(r.dropped_rows for r in reports) == 5
        made_count = sum(r.made for r in reports)
        assert made_count >= 2 * len(AUDIT_TABLES)
        assert made_count % len(AUDIT_TABLES) == 0
        made = await first.fetch(
            "SELECT table_name, range_from, count(*) AS n FROM retention_actions"
            " WHERE action = 'made' GROUP BY 1, 2 HAVING count(*) > 1"
        )
        assert made == []


async def test_a_run_interrupted_after_the_detach_is_finished_by_the_next(
    stack: support.Stack,
) -> None:
    """A partition detached (the run died before the drop) is dropped and recorded next."""
    async with support.pg_connection(stack.database_url) as conn:
        now = await _now(conn)
        await _expired_at(conn, now - 100 * DAY, 7)
        name = f"reservation_transitions_w{week_of(now - 100 * DAY):%Y%m%d}"
        await conn.execute(f'ALTER TABLE reservation_transitions DETACH PARTITION "{name}"')
        report = await housekeeping.run(conn, stack.settings, say=lambda _line: None)
        assert report.dropped_rows == 7
        assert await conn.fetchval("SELECT to_regclass($1)", name) is None
        row = await conn.fetchrow(
            "SELECT range_from, rows FROM retention_actions WHERE action = 'dropped'"
        )
        assert row is not None
        assert row["rows"] == 7
        assert row["range_from"] == week_of(now - 100 * DAY)


async def test_prunes_take_what_cannot_matter_and_leave_the_rest(stack: support.Stack) -> None:
    """Leases of final holds past an hour go, a held hold's stays; settled dead letters
    past the retention go, open and parked ones stay; old working records go but the
    newest pass stays."""
    settings = stack.settings
    async with support.pg_connection(stack.database_url) as conn:
        final, held = uuid.uuid4(), uuid.uuid4()
        await conn.execute(
            "INSERT INTO reservations (id, status, hold_until) VALUES"
            " ($1, 'expired', now() - interval '3h'), ($2, 'held', now() - interval '3h')",
            final,
            held,
        )
        await conn.execute(
            "INSERT INTO publish_leases (reservation_id, message_id, lease_until)"
            " VALUES ($1, 'a', now() - interval '2 hours'), ($2, 'b', now() - interval '2 hours')",
            final,
            held,
        )
        for n, (status, age) in enumerate(
            [("replayed", 200), ("closed", 200), ("dead", 200), ("replayed", 10)]
        ):
            await conn.execute(
                "INSERT INTO dead_letters (message_id, error_class, give_up, reason, attempts,"
                " first_seen, last_seen, worker, status, updated_at) VALUES ($1, 'x', 'permanent',"
                " 'r', 1, now(), now(), 'w', $2, now() - make_interval(days => $3))",
                f"m{n}",
                status,
                age,
            )
        await conn.execute(
            "INSERT INTO scan_passes (scanner, finished_at, result, published, unconfirmed)"
            " VALUES ('gone', now() - interval '30 days', 'ok', 0, 0),"
            " ('last', now() - interval '20 days', 'ok', 0, 0)"
        )
        # Batches of one: each prune walks its table's key in several statements.
        report = await housekeeping.run(conn, settings, say=lambda _line: None, batch=1)
        assert report.pruned == {"publish_leases": 1, "dead_letters": 2, "scan_passes": 1}
        leases = await conn.fetch("SELECT reservation_id FROM publish_leases")
        assert [r["reservation_id"] for r in leases] == [held]
        left = await conn.fetch("SELECT message_id FROM dead_letters ORDER BY message_id")
        assert [r["message_id"] for r in left] == ["m2", "m3"]
        scanners = await conn.fetch("SELECT scanner FROM scan_passes")
        assert [r["scanner"] for r in scanners] == ["last"]
        pruned = await conn.fetch(
            "SELECT table_name, rows FROM retention_actions WHERE action = 'pruned' ORDER BY 1"
        )
        assert {r["table_name"]: r["rows"] for r in pruned} == report.pruned


async def test_retention_while_consumers_and_scans_run_expires_every_hold_once(
    stack: support.Stack,
) -> None:
    """Runs back to back (each making and dropping weeks) beside a consumer and scans:
    every hold expires once, with one transition, and verify proves it."""
    settings = stack.settings
    ids = await support.insert_holds(stack.database_url, 600)
    stop = asyncio.Event()

    async def retaining() -> int:
        runs = 0
        async with support.pg_connection(stack.database_url) as conn:
            now = await _now(conn)
            await _expired_at(conn, now - 100 * DAY, 5)
            while not stop.is_set():
                # The clock a week on each run, up to eight: weeks are made and dropped,
                # never the one the consumer writes in.
                moved = now + (runs % 8) * WEEK
                await housekeeping.run(conn, settings, now=moved, say=lambda _line: None)
                runs += 1
        return runs

    async with support.attached_consumer(stack):
        keeping = asyncio.create_task(retaining())
        for _ in range(20):
            await scan.scan_once(settings)
            await asyncio.sleep(0.1)
        await support.eventually(lambda: _all_expired(stack.database_url, len(ids)), timeout=60)
        stop.set()
        assert await keeping >= 2
    per_hold = await support.transitions_per_reservation(stack.database_url)
    assert set(ids) <= set(per_hold)
    assert {per_hold[i] for i in ids} == {1}
    async with support.pg_connection(stack.database_url) as conn:
        verdict = await verify(conn, limit=5, scan_interval=settings.scan_interval_seconds)
    assert not verdict.failed, verdict.lines()


async def _all_expired(url: str, count: int) -> bool:
    return (await support.statuses(url)).get("expired", 0) >= count


async def test_an_existing_database_moves_over_without_losing_a_row(
    endpoints: support.Endpoints,
) -> None:
    """A database of the release before retention, with audit rows of several months:
    ``migrate`` makes the tables partitioned, every row and id kept, new rows go on
    after the highest id, and retention drops the old rows once all of them are past it."""
    name = f"expiry_ret_{uuid.uuid4().hex[:8]}"
    url = await create_database(endpoints.database_url, name)
    try:
        settings = support.stack_settings(url, endpoints.amqp_url)
        await migrate(settings, until="0012_console_sessions")
        async with support.pg_connection(url) as conn:
            await conn.execute(
                "INSERT INTO reservations (id, status, hold_until)"
                " SELECT gen_random_uuid(), 'expired', now() - g * interval '1 hour'"
                "   FROM generate_series(1, 5000) AS g"
            )
            await conn.execute(
                "INSERT INTO reservation_transitions"
                " (reservation_id, from_status, to_status, at, worker)"
                " SELECT id, 'held', 'expired', hold_until + interval '1 second', 'w'"
                "   FROM reservations"
            )
            await conn.execute(
                "INSERT INTO console_logins (name, known, client_host, device, outcome)"
                " VALUES ('a', true, 'h', false, 'ok')"
            )
            before = await _audit(conn, AUDIT_TABLES[:4])  # expiry_events_sent: 0014 on
        await migrate(settings)
        async with support.pg_connection(url) as conn:
            assert await _audit(conn, AUDIT_TABLES[:4]) == before
            assert (
                await conn.fetchval(
                    "SELECT relkind::text FROM pg_class WHERE relname = 'reservation_transitions'"
                )
                == "p"
            )
            new_id = await conn.fetchval(
                "INSERT INTO reservation_transitions"
                " (reservation_id, from_status, to_status, worker)"
                " SELECT id, 'held', 'expired', 'w' FROM reservations LIMIT 1 RETURNING id"
            )
            assert new_id > before["reservation_transitions"]["max_id"]
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute("DELETE FROM reservation_transitions_legacy")
            listed = await store.list_partitions(conn)
            legacy = next(
                p for p in listed.partitions if p.name == "reservation_transitions_legacy"
            )
            now = await _now(conn)
            report = await housekeeping.run(
                conn, settings, now=legacy.high + 91 * DAY, say=lambda _line: None
            )
            assert report.dropped_rows >= 5000
            assert (
                await conn.fetchval("SELECT to_regclass('reservation_transitions_legacy')") is None
            )
            assert now < legacy.high
    finally:
        await drop_database(endpoints.database_url, name)


async def _audit(
    conn: asyncpg.Connection[asyncpg.Record], tables: tuple[str, ...]
) -> dict[str, Any]:
    found = {}
    for table in tables:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, coalesce(max(id), 0) AS max_id,"
            f" md5(string_agg(id::text || at::text, ',' ORDER BY id)) AS digest FROM {table}"
        )
        found[table] = dict(row) if row else {}
    return found


async def test_expiries_past_the_last_week_are_retried_until_retention_makes_it(
    stack: support.Stack,
) -> None:
    """The weeks ran out (retention stopped long ago): an expiry has no partition for its
    transition, so it fails whole (the hold stays held) and is retried as db.no-partition,
    not dead-lettered; once retention runs, every hold expires once."""
    ids = await support.insert_holds(stack.database_url, 5)
    async with support.pg_connection(stack.database_url) as conn:
        for part in (await store.list_partitions(conn)).partitions:
            if part.table == "reservation_transitions":
                await conn.execute(f'ALTER TABLE "{part.table}" DETACH PARTITION "{part.name}"')
                await conn.execute(f'DROP TABLE "{part.name}"')
        async with support.attached_consumer(stack):
            await scan.scan_once(stack.settings)
            await asyncio.sleep(1.5)  # an attempt or two, each refused for want of a week
            assert (await support.statuses(stack.database_url)) == {"held": 5}
            assert await conn.fetchval("SELECT count(*) FROM dead_letters") == 0
            await housekeeping.run(conn, stack.settings, say=lambda _line: None)
            await support.eventually(lambda: _all_expired(stack.database_url, 5), timeout=30)
        assert await conn.fetchval("SELECT count(*) FROM dead_letters") == 0
    per_hold = await support.transitions_per_reservation(stack.database_url)
    assert {per_hold.get(i) for i in ids} == {1}


async def test_dead_webhook_deliveries_go_with_their_closed_dead_letters(
    stack: support.Stack,
) -> None:
    """A dead delivery whose dead letter was closed before the retention goes, and one
    whose dead letter is gone too; one whose dead letter is open, or closed lately, stays,
    and so does every pending one."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("INSERT INTO webhook_endpoints (name) VALUES ('crm')")
        for n, dead in enumerate([True, True, True, True, False]):
            await conn.execute(
                "INSERT INTO webhook_deliveries (endpoint, message_id, reservation_id,"
                " hold_until, expired_at, dead) VALUES ('crm', $1, gen_random_uuid(), now(),"
                " now(), $2)",
                f"m{n}",
                dead,
            )
        for n, (status, age) in enumerate([("closed", 200), ("dead", 200), ("closed", 10)]):
            await conn.execute(
                "INSERT INTO dead_letters (message_id, error_class, give_up, reason, attempts,"
                " first_seen, last_seen, worker, status, updated_at) VALUES ($1,"
                " 'webhook.rejected', 'attempts-exhausted', 'r', 15, now(), now(), 'd', $2,"
                " now() - make_interval(days => $3))",
                f"webhook:crm:m{n}",
                status,
                age,
            )
        # m0: closed 200 days ago; m1: open; m2: closed 10 days ago; m3: its dead letter gone;
        # m4: pending.
        report = await housekeeping.run(conn, stack.settings, say=lambda _line: None, batch=1)
        assert report.pruned["webhook_deliveries"] == 2
        left = await conn.fetch("SELECT message_id FROM webhook_deliveries ORDER BY 1")
    assert [row["message_id"] for row in left] == ["m1", "m2", "m4"]
