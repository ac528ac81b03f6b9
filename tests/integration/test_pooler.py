"""Behind a transaction pooler (Debian's PgBouncer in ``pool_mode = transaction``, only
``extra_float_digits`` ignored, two server sessions for every client): no named
prepared statement, the timeouts in every transaction, migrate's lock, the relay's
poll, and the operator's commands (docs/deployment.md, "Behind a transaction pooler").

The pooler leg of ``.ci/run`` runs the pipeline, the console, the deliverer and two
fault scenarios through PgBouncer as well (``TEST_POOLER=pgbouncer``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from service.adapters import postgres
from service.adapters.postgres.databases import create_database, drop_database
from service.adapters.postgres.schema import load_migrations, migrate
from tests import support
from tests.acceptance.processes import run
from tests.events_support import all_sent, bind_reader_queue, insert_events, running_relay
from tests.pooler import Pooler, running_pgbouncer

SERVER_SESSIONS = 2  # every client shares two server sessions: what one leaves, another meets


@pytest.fixture(scope="module")
def bouncer(endpoints: support.Endpoints) -> Iterator[Pooler]:
    with running_pgbouncer(endpoints.database_url, pool_size=SERVER_SESSIONS) as running:
        yield running


@pytest.fixture
def pooled(stack: support.Stack, bouncer: Pooler) -> support.Stack:
    """The stack, its settings through the pooler."""
    return stack.with_settings(
        database_url=bouncer.url_for(stack.database_url), db_pooler="transaction"
    )


async def test_named_statements_collide_behind_it_and_the_service_makes_none(
    pooled: support.Stack,
) -> None:
    """Two processes' plain asyncpg connections (their statement cache on) meet on one
    server session (PgBouncer reuses the last one used): the second's
    ``__asyncpg_stmt_1__`` exists already there. Ten of the service's connections, 50
    statements each, meet nothing."""
    url = pooled.settings.database_url
    said = [await _one_plain_process(url) for _ in range(2)]
    assert said == ["ok", "DuplicatePreparedStatementError"]  # the trap is real here

    async with postgres.pooled(pooled.settings, name="pooler-test", size=10) as pool:

        async def many(worker: int) -> int:
            total = 0
            async with pool.acquire() as conn:
                for i in range(50):
                    total += await conn.fetchval("SELECT $1::int + $2::int", worker, i)
                    async with postgres.transaction(conn):
                        await conn.fetchval("SELECT count(*) FROM reservations")
            return total

        totals = await asyncio.gather(*(many(worker) for worker in range(10)))
    assert totals == [50 * worker + sum(range(50)) for worker in range(10)]


PLAIN_PROCESS = """
import asyncio, sys, asyncpg

async def main():
    conn = await asyncpg.connect(sys.argv[1])
    try:
        await conn.fetchval("SELECT $1::int", 1)
        print("ok")
    except asyncpg.PostgresError as exc:
        print(type(exc).__name__)
    finally:
        conn.terminate()

asyncio.run(main())
"""


async def _ms(conn: postgres.Connection, name: str) -> int:
    """A timeout's value in this session now, in milliseconds."""
    value = await conn.fetchval(
        "SELECT extract(epoch FROM current_setting($1)::interval) * 1000", name
    )
    return int(value)


async def _one_plain_process(url: str) -> str:
    """What a fresh process's first statement meets through the pooler."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PLAIN_PROCESS, url, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    return out.decode().strip()


async def test_every_transaction_has_the_timeouts_without_start_up_parameters(
    pooled: support.Stack,
) -> None:
    """Inside a transaction the settings' lock and statement timeouts hold (outside one,
    the server's defaults: nothing came with the session); the guarded update on a row
    another session holds ends at the lock timeout (LockNotAvailable), not at the
    client's command timeout."""
    settings = pooled.settings
    [held] = await support.insert_holds(pooled.database_url, 1)
    async with postgres.pooled(settings, name="pooler-test", size=2) as pool:
        async with pool.acquire() as conn:
            async with postgres.transaction(conn):
                assert await _ms(conn, "lock_timeout") == settings.lock_timeout_ms
                assert await _ms(conn, "statement_timeout") == settings.statement_timeout_ms
            assert await _ms(conn, "lock_timeout") == 0
        async with support.pg_connection(pooled.database_url) as holder:
            locking = holder.transaction()
            await locking.start()
            await holder.execute("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE", held)
            try:
                async with pool.acquire() as conn:
                    with pytest.raises(asyncpg.LockNotAvailableError):
                        await postgres.expire_reservation(
                            conn, held, message_id="m", attempt=1, worker="w"
                        )
            finally:
                await locking.rollback()


async def test_migrate_through_it_twice_at_once_applies_each_migration_once(
    endpoints: support.Endpoints, bouncer: Pooler
) -> None:
    """Two migrates of an empty database at once, both through the pooler: the lock (a
    transaction's) holds, one applies everything, the other nothing."""
    name = f"expiry_pooler_{support.RUN_ID}"
    direct = await create_database(endpoints.database_url, name)
    try:
        settings = support.stack_settings(bouncer.url_for(direct), endpoints.amqp_url)
        settings = settings.model_copy(update={"db_pooler": "transaction"})
        first, second = await asyncio.gather(migrate(settings), migrate(settings))
        shipped = [m.version for m in load_migrations()]
        assert sorted([first, second], key=len) == [[], shipped]
        async with support.pg_connection(direct) as conn:
            assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(shipped)
    finally:
        await drop_database(endpoints.database_url, name)


async def test_the_relay_polls_behind_it_and_says_so_or_listens_on_the_session_url(
    pooled: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """Without EXPIRY_DB_SESSION_URL the relay says at start that it polls
    (relay.polling_only) and publishes every event from its poll; with it, it LISTENs
    there."""
    caplog.set_level(logging.INFO, "service.relay")
    settings = pooled.settings.model_copy(update={"relay_poll_seconds": 0.2})
    await bind_reader_queue(pooled.amqp_url)
    await insert_events(pooled, 20)
    async with running_relay(settings):
        await support.eventually(lambda: all_sent(pooled, 20))
    said = [record.msg for record in caplog.records]
    assert said.count("relay.polling_only") == 1
    assert "relay.listening" not in said
    caplog.clear()
    listening = settings.model_copy(update={"db_session_url": pooled.database_url})
    async with running_relay(listening):
        await insert_events(pooled, 5)
        await support.eventually(lambda: all_sent(pooled, 25))
    said = [record.msg for record in caplog.records]
    assert "relay.listening" in said
    assert "relay.polling_only" not in said


async def test_a_relay_whose_listen_server_is_down_at_start_starts_and_polls(
    pooled: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """EXPIRY_DB_SESSION_URL naming a server that is down (a closed port) is no setting
    to refuse, it may come back: the relay starts, says relay.listen_failed once, and
    publishes every event from its poll."""
    caplog.set_level(logging.INFO, "service.relay")
    down = pooled.database_url.replace(
        f":{urlsplit(pooled.database_url).port}/", f":{support.free_port()}/"
    )
    settings = pooled.settings.model_copy(
        update={"relay_poll_seconds": 0.2, "db_session_url": down}
    )
    await bind_reader_queue(pooled.amqp_url)
    await insert_events(pooled, 20)
    async with running_relay(settings):
        await support.eventually(lambda: all_sent(pooled, 20))
    failed = [record for record in caplog.records if record.msg == "relay.listen_failed"]
    assert [record.levelno for record in failed][:1] == [logging.WARNING]
    assert all(record.levelno == logging.DEBUG for record in failed[1:])
    assert "relay.listening" not in [record.msg for record in caplog.records]


@pytest.mark.parametrize(
    "command",
    [
        ("service.status",),
        ("service.verify",),
        ("service.retention",),
        ("service.deadletters", "list"),
        ("service.migrate",),
    ],
)
async def test_the_operators_commands_run_through_it(
    pooled: support.Stack, command: tuple[str, ...]
) -> None:
    """status, verify, retention, deadletters and migrate, through the pooler: each ends
    as it does straight to the server (the same exit code), and nothing says 'prepared
    statement' or shows a traceback."""
    straight = pooled.env(DATABASE_URL=pooled.database_url, EXPIRY_DB_POOLER="none")
    expected = await asyncio.to_thread(run, *command, env=straight)
    done = await asyncio.to_thread(run, *command, env=pooled.env())
    output = done.stdout + done.stderr
    assert done.returncode == expected.returncode, output
    assert "prepared statement" not in output
    assert "Traceback" not in output
