"""A rollout from the previous release's image to this one while holds expire: the new
release's migrations run under the previous release's consumers, which go on working on
the new schema; then both releases' consumers work side by side, then the previous ones
stop; every hold is expired exactly once (docs/deployment.md, "Upgrades")."""

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
HOLDS = 9000
SECONDS = 24  # the holds fall due over this long: the whole rollout happens meanwhile


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


async def test_a_rollout_from_the_previous_release_expires_every_hold_once(
    world: World, previous_image: str
) -> None:
    """The previous release migrates, declares and runs two consumers and the scanner;
    holds fall due throughout; this release migrates and declares under them, its
    consumers and scanner join, the previous ones are stopped (exit 0); each release
    expires some, and every hold is expired exactly once."""
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
        ids = await insert_holds_due_over(world.database_url, HOLDS, SECONDS)
        started = time.monotonic()
        await world.wait_expired(HOLDS // 6)

        # The rollout: this release's migrations and topology under the running release.
        at_migrate = await world.expired()
        migrated = await world.run_step("migrate") + await world.run_step("declare")
        await world.wait_expired(at_migrate + HOLDS // 12)  # the previous consumers go on

        new_consumers = [
            await _start(world, f"new-consumer-{n}", python_m("consume")) for n in (1, 2)
        ]
        new_scanner = await _start(world, "new-scanner", python_m("produce", "--every", "1"))
        side_by_side = await world.expired()
        await world.wait_expired(side_by_side + HOLDS // 6)
        old_stops = [await stop_ok(old, name, CONSUMER_GRACE) for name in old_consumers]
        old_stops.append(await stop_ok(old, old_scanner, SCANNER_GRACE))
        at_handover = await world.expired()
        assert at_handover < HOLDS, "the holds ran out before the previous release stopped"

        await world.wait_expired(HOLDS, timeout=SECONDS + 120)
        await world.assert_each_expired_once(ids)
        by_release = await _expired_by(world)
        assert by_release.get("previous", 0) > 0, by_release
        assert by_release.get("new", 0) > 0, by_release
        for name in [*new_consumers, new_scanner]:
            await stop_ok(new, name, CONSUMER_GRACE)
        await world.run_step("verify", role=OPERATOR_ROLE)
    FIGURES.append(
        f"rollout {previous_image} -> {new.image}: {HOLDS} holds due over {SECONDS} s; "
        f"this release migrated and declared in {migrated:.1f} s under the previous one's "
        f"consumers at {at_migrate} expired; both side by side from {side_by_side}; the "
        f"previous stopped (exit 0, at most {max(old_stops):.1f} s) at {at_handover}; "
        f"expired by the previous release {by_release.get('previous', 0)}, by this one "
        f"{by_release.get('new', 0)}, each hold once, in {time.monotonic() - started:.1f} s; "
        "verify exit 0"
    )
