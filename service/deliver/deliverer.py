"""The deliverer process, from its start to a clean stop.

At its start it refuses, in one line, settings it cannot work with (no endpoint; a
lease not longer than an endpoint's timeout), checks that every migration it ships is
applied (exit 5 otherwise), and registers its endpoints (deliveries are written for
them from then on); then one courier per endpoint (``courier.py``) delivers until
SIGTERM or SIGINT, the attempts in flight are settled, and ``python -m service.deliver``
exits 0.

Its endpoint (``EXPIRY_HTTP_PORT``) serves ``/healthz``, ``/readyz`` (the database
answers; it is not stopping) and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from service.adapters import postgres
from service.adapters.http.server import serving
from service.adapters.http.webhook_sender import Sender
from service.adapters.postgres import webhook_endpoints as endpoints
from service.adapters.postgres.schema import require_current_schema
from service.adapters.telemetry import recorder_for
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.adapters.telemetry.tracing import follows_head
from service.core.errors import ServiceError, UsageError
from service.deliver.courier import Courier
from service.settings import Settings

log = logging.getLogger("service.deliver")


class RetireBusy(ServiceError):
    """The endpoints' table could not be had alone within the lock timeout."""


# A claim outlives its attempt by this much at least (the settle's round trip).
LEASE_MARGIN_SECONDS = 5.0
READINESS_TIMEOUT_SECONDS = 2.0
BACKLOG_READ_SECONDS = 15.0


def check_settings(settings: Settings) -> None:
    """Refuse, in one line naming the setting, what the deliverer cannot work with."""
    if not settings.webhooks:
        raise UsageError(
            "EXPIRY_WEBHOOKS (or EXPIRY_WEBHOOKS_FILE) names no endpoint: there is nothing to "
            "deliver to (docs/webhooks.md)"
        )
    for endpoint in settings.webhooks:
        if endpoint.timeout_seconds + LEASE_MARGIN_SECONDS > settings.webhook_lease_seconds:
            raise UsageError(
                f"EXPIRY_WEBHOOK_LEASE_SECONDS ({settings.webhook_lease_seconds:g}) must exceed "
                f"every endpoint's timeout_seconds by {LEASE_MARGIN_SECONDS:g} s at least "
                f"(endpoint {endpoint.name!r}: {endpoint.timeout_seconds:g} s)"
            )


async def run(
    settings: Settings, stop: asyncio.Event, *, metrics: DeliverMetrics | None = None
) -> list[Courier]:
    """Deliver until ``stop`` is set; settle what is in flight, close, and return the
    couriers."""
    check_settings(settings)
    metrics = metrics or DeliverMetrics()
    size = 2 + len(settings.webhooks) * 2  # each courier looks while it settles
    async with contextlib.AsyncExitStack() as opened:
        pool = await opened.enter_async_context(
            postgres.pooled(settings, name="expiry-deliver", size=size)
        )
        async with pool.acquire() as conn:
            await require_current_schema(conn)
            await endpoints.register(conn, [endpoint.name for endpoint in settings.webhooks])
        couriers = []
        recorder = recorder_for("service.deliver")  # installed by now, when tracing is on
        head = follows_head(settings)
        for endpoint in settings.webhooks:
            sender = Sender(
                endpoint,
                concurrency=settings.webhook_concurrency,
                hosts=settings.webhook_allowed_hosts,
            )
            opened.push_async_callback(sender.close)
            couriers.append(
                Courier(
                    settings, endpoint, pool, sender, metrics, recorder=recorder, follows_head=head
                )
            )
        metrics.objective_seconds = settings.webhook_objective_seconds

        async def readiness() -> dict[str, bool]:
            return {
                "running": not stop.is_set(),
                "database": await postgres.answers(pool, READINESS_TIMEOUT_SECONDS),
            }

        async with serving(settings.http_host, settings.http_port, readiness):
            log.info(
                "deliver.started",
                extra={"endpoints": [endpoint.name for endpoint in settings.webhooks]},
            )
            reading = asyncio.create_task(_read_backlogs(pool, metrics, stop))
            try:
                await asyncio.gather(*(courier.run(stop) for courier in couriers))
            finally:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
    log.info("deliver.stopped")
    return couriers


async def retire(settings: Settings, name: str, *, yes: bool, say: Callable[[str], None]) -> int:
    """``--retire NAME``: what would go (and, with ``yes``, its going), in lines."""
    opened = postgres.pooled(settings, name="expiry-deliver retire", size=1)
    async with opened as pool, pool.acquire() as conn:
        await require_current_schema(conn)
        shown = {row.endpoint: row for row in await endpoints.backlog(conn)}
        if name not in shown:
            raise UsageError(f"--retire: no endpoint {name!r} is registered")
        row = shown[name]
        say(
            f"endpoint {name}: {row.pending} pending and {row.dead} dead deliveries"
            + (", paused" if row.paused_for > 0 else "")
        )
        if not yes:
            say("nothing done: --yes retires it (its dead letters stay)")
            return 0
        try:
            async with postgres.transaction(conn):
                _, pending, dead = await endpoints.retire(conn, name)
        except asyncpg.LockNotAvailableError:
            raise RetireBusy(
                "expiries kept the endpoints' table past EXPIRY_LOCK_TIMEOUT_MS "
                f"({settings.lock_timeout_ms} ms); nothing was retired: run it again"
            ) from None
    say(
        f"retired endpoint {name}: {pending} pending and {dead} dead deliveries deleted; no "
        "delivery is written for it any more (a deliverer started with it registers it again)"
    )
    log.info("webhook.retired", extra={"endpoint": name, "pending": pending, "dead": dead})
    return 0


async def enable(settings: Settings, name: str, *, say: Callable[[str], None]) -> int:
    """``--enable NAME``: an endpoint disabled by a 410 Gone is sent to again."""
    opened = postgres.pooled(settings, name="expiry-deliver enable", size=1)
    async with opened as pool, pool.acquire() as conn:
        await require_current_schema(conn)
        async with postgres.transaction(conn):
            enabled = await endpoints.enable(conn, name)
    if not enabled.registered:
        raise UsageError(f"--enable: no endpoint {name!r} is registered")
    if enabled.disabled_at is None:
        say(f"endpoint {name} was not disabled: nothing changed")
        return 0
    since = enabled.disabled_at.isoformat(timespec="seconds")
    say(
        f"enabled endpoint {name} (disabled since {since}): its {enabled.pending} waiting "
        "deliveries are due now, the time it was disabled left out of their age"
    )
    log.info(
        "webhook.enabled",
        extra={"endpoint": name, "disabled_since": since, "pending": enabled.pending},
    )
    return 0


async def _read_backlogs(pool: postgres.Pool, metrics: DeliverMetrics, stop: asyncio.Event) -> None:
    """Each endpoint's deliveries into the gauges, every BACKLOG_READ_SECONDS until stop."""
    while not stop.is_set():
        try:
            async with pool.acquire() as conn:
                metrics.backlogs = await endpoints.backlog(conn)
        except Exception as exc:  # the gauges keep their last values; the next read retries
            log.warning("webhook.backlog_unread", extra={"error_class": type(exc).__name__})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BACKLOG_READ_SECONDS):
                await stop.wait()
