"""A rollout from the previous release's image to this one while holds expire: the new
release's migrations run under the previous release's consumers, which go on working on
the new schema; then both releases' consumers work side by side, then the previous ones
stop; every hold is expired exactly once (docs/deployment.md, "Upgrades"), and every
expiry after this release's migration, whichever release made it, has exactly one event
in the outbox (docs/events.md, "During a rolling deploy")."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.image.containers import DOCKER, containers_of
from tests.image.world import (
    CONSUMER_GRACE,
    CONSUMER_ROLE,
    FIGURES,
    OPERATOR_ROLE,
    SCAN_ROLE,
    SCANNER_GRACE,
    World,
    insert_holds_due_over,
    python_m,
    stop_ok,
)
from tests.support import missing, pg_connection

pytestmark = pytest.mark.image

# The previous release's image (.ci/image builds it from that release's commit).
PREVIOUS_IMAGE = os.environ.get("PREVIOUS_SERVICE_IMAGE", "")
FIRST = 3000  # due over SECONDS while the previous release runs alone, then migrates
SECOND = 3000  # due over SECONDS once both releases run: the handover happens meanwhile
SECONDS = 8


@pytest.fixture
def previous_image() -> str:
    """The previous release's image (PREVIOUS_SERVICE_IMAGE)."""
    if not PREVIOUS_IMAGE:
        missing("PREVIOUS_SERVICE_IMAGE names no image of the previous release (.ci/image)")
    probe = subprocess.run(
        [DOCKER, "image", "inspect", PREVIOUS_IMAGE], capture_output=True, check=False
    )
    if probe.returncode != 0:
        missing(f"the Docker engine has no image {PREVIOUS_IMAGE}")
    return PREVIOUS_IMAGE


async def _start(world: World, name: str, command: list[str]) -> str:
    """A long-running command of ``world``'s image, its worker id ``name``."""
    role = SCAN_ROLE if "scanner" in name else CONSUMER_ROLE
    return await world.start_serving(name, command, role, EXPIRY_WORKER_ID=name)


async def _expired_by(world: World) -> dict[str, int]:
    """Expiries by release: the worker ids start with ``previous`` or ``new``."""
    async with pg_connection(world.database_url) as conn:
        rows = await conn.fetch(
            "SELECT split_part(worker, '-', 1) AS release, count(*) AS n"
            "  FROM reservation_transitions GROUP BY 1"
        )
    return {row["release"]: row["n"] for row in rows}


# Each expiry's events (pending or sent), by the release of the worker that expired it.
EVENTS_BY_RELEASE = """
WITH events AS (
    SELECT reservation_id FROM expiry_events
    UNION ALL
    SELECT reservation_id FROM expiry_events_sent
)
SELECT split_part(t.worker, '-', 1) AS release, count(e.reservation_id) AS events,
       count(*) FILTER (WHERE e.reservation_id IS NULL) AS without
  FROM reservation_transitions t
  LEFT JOIN events e ON e.reservation_id = t.reservation_id
 WHERE t.to_status = 'expired'
 GROUP BY 1
"""


async def _events_by(world: World) -> dict[str, tuple[int, int]]:
    """Per release: events of its expiries, and its expiries without one."""
    async with pg_connection(world.database_url) as conn:
        rows = await conn.fetch(EVENTS_BY_RELEASE)
        doubled = await conn.fetchval(
            "SELECT count(*) FROM (SELECT reservation_id FROM expiry_events UNION ALL"
            " SELECT reservation_id FROM expiry_events_sent) AS e"
            " GROUP BY reservation_id HAVING count(*) > 1 LIMIT 1"
        )
    assert doubled is None, "an expiry has two events"
    return {row["release"]: (row["events"], row["without"]) for row in rows}


async def test_a_rollout_from_the_previous_release_expires_every_hold_once(
    world: World, previous_image: str
) -> None:
    """The previous release migrates, declares and runs two consumers and the scanner while
    holds fall due; this release migrates and declares under them; more holds fall due while
    both releases' consumers and scanners run side by side; the previous ones are stopped
    (exit 0) while they still fall due; each release expires some, every hold is expired
    exactly once, every expiry by this release has its event, and so have the previous
    release's once this release migrated. Each phase brings its own holds, so that every
    window has work however fast or loaded the machine is."""
    new = world.containers
    async with containers_of(previous_image, new.env_dir) as old:
        previous = world.of(old)
        await previous.run_step("migrate")
        await previous.run_step("declare")
        old_consumers = [
            await _start(previous, f"previous-consumer-{n}", python_m("consume")) for n in (1, 2)
        ]
        old_scanner = await _start(
            previous, "previous-scanner", python_m("produce", "--every", "1")
        )
        started = time.monotonic()
        first = await insert_holds_due_over(world.database_url, FIRST, SECONDS)
        await world.wait_expired(FIRST // 6)

        # The rollout: this release's migrations and topology under the running release.
        at_migrate = await world.expired()
        migrated = await world.run_step("migrate") + await world.run_step("declare")
        new_consumers = [
            await _start(world, f"new-consumer-{n}", python_m("consume")) for n in (1, 2)
        ]
        new_scanner = await _start(world, "new-scanner", python_m("produce", "--every", "1"))

        # Side by side: both releases consume the same queue and scan the same holds.
        side_by_side = await world.expired()
        second = await insert_holds_due_over(world.database_url, SECOND, SECONDS)
        await world.wait_expired(side_by_side + SECOND // 3)
        total = FIRST + SECOND
        at_stop = await world.expired()
        assert at_stop < total, "every hold had expired before the previous release was stopped"
        old_stops = [await stop_ok(old, name, CONSUMER_GRACE) for name in old_consumers]
        old_stops.append(await stop_ok(old, old_scanner, SCANNER_GRACE))
        at_handover = await world.expired()

        await world.wait_expired(total, timeout=SECONDS + 120)
        await world.assert_each_expired_once(first + second)
        by_release = await _expired_by(world)
        assert by_release.get("previous", 0) > 0, by_release
        assert by_release.get("new", 0) > 0, by_release
        events = await _events_by(world)
        assert events["new"] == (by_release["new"], 0), events
        assert 0 < events["previous"][0] <= by_release["previous"] - at_migrate, events
        for name in [*new_consumers, new_scanner]:
            await stop_ok(new, name, CONSUMER_GRACE)
        await world.run_step("verify", role=OPERATOR_ROLE)
    FIGURES.append(
        f"rollout {previous_image} -> {new.image}: {FIRST} holds due over {SECONDS} s, then "
        f"{SECOND} more once both releases ran; this release migrated and declared in "
        f"{migrated:.1f} s under the previous one's consumers at {at_migrate} expired; both "
        f"side by side from {side_by_side}; the previous stopped (exit 0, at most "
        f"{max(old_stops):.1f} s) at {at_handover}; expired by the previous release "
        f"{by_release.get('previous', 0)}, by this one {by_release.get('new', 0)}, each hold "
        f"once, in {time.monotonic() - started:.1f} s; verify exit 0; events: "
        f"{events['new'][0]} of this release's expiries, {events['previous'][0]} of the "
        "previous release's (made after the migration)"
    )
