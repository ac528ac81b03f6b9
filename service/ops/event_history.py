"""What happened to an event, endpoint by endpoint ("did you send us X, when, and what
did we answer?"): its attempts from the attempt log, and its deliveries still waiting,
told as lines or as JSON (``python -m service.attempts``, the console).

Each endpoint registered reads delivered (an attempt answered 2xx), pending (its next
attempt's time), dead (a dead letter), or, with none of these, why: registered after
the event was written (a backfill sends it), or nothing recorded (retired since, or an
attempt older than what retention keeps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.adapters import postgres
from service.adapters.postgres import webhook_attempts as log

REGISTERED = "SELECT name, registered_at FROM webhook_endpoints ORDER BY name"


@dataclass(frozen=True)
class EndpointStory:
    """One endpoint's side of one event."""

    endpoint: str
    state: str  # delivered, pending, dead, registered-later, nothing-recorded
    attempts: list[log.LoggedAttempt] = field(default_factory=list)
    waiting: log.Waiting | None = None

    def lines(self) -> list[str]:
        """Its state in a line, then each attempt in one."""
        return [f"  {self.endpoint}: {self._said()}", *(_attempt_line(a) for a in self.attempts)]

    def _said(self) -> str:
        tried = len(self.attempts)
        if self.state == "delivered":
            return f"delivered, after {tried} attempt(s)"
        if self.state == "pending" and self.waiting is not None:
            at = self.waiting.next_at.isoformat(timespec="seconds")
            return f"pending, {tried} attempt(s) so far, the next at {at}"
        if self.state == "dead":
            return (
                f"dead letter after {tried} attempt(s): "
                "python -m service.deadletters list --error-class 'webhook.*'"
            )
        if self.state == "registered-later":
            return (
                "no delivery: registered after this event was written "
                f"(python -m service.deliver --backfill {self.endpoint} --since TIME sends it)"
            )
        return (
            "nothing recorded: retired since, or its attempts are older than what retention keeps"
        )

    def as_json(self) -> dict[str, Any]:
        """The same as data."""
        waiting = self.waiting
        return {
            "endpoint": self.endpoint,
            "state": self.state,
            "next_at": None if waiting is None or waiting.dead else waiting.next_at.isoformat(),
            "attempts": [
                {
                    "at": a.at.isoformat(),
                    "attempt": a.attempt,
                    "kind": a.kind,
                    "status": a.status,
                    "error_class": a.error_class,
                    "duration_ms": a.duration_ms,
                    "deliverer": a.deliverer,
                }
                for a in self.attempts
            ],
        }


@dataclass(frozen=True)
class EventStory:
    """One event and every endpoint's side of it."""

    event: log.Event
    endpoints: list[EndpointStory]

    def lines(self) -> list[str]:
        """The event in a line, then each endpoint's lines."""
        event = self.event
        head = (
            f"event {event.message_id} (reservation {event.reservation_id}), expired "
            f"{event.expired_at.isoformat(timespec='seconds')}, "
            + ("published" if event.state == "sent" else "not yet published")
            + " to expiry.events"
        )
        if not self.endpoints:
            return [head, "  no webhook endpoint is registered"]
        return [head, *(line for story in self.endpoints for line in story.lines())]

    def as_json(self) -> dict[str, Any]:
        """The same as data."""
        event = self.event
        return {
            "message_id": event.message_id,
            "reservation_id": str(event.reservation_id),
            "expired_at": event.expired_at.isoformat(),
            "written_at": event.created_at.isoformat(),
            "published": event.state == "sent",
            "endpoints": [story.as_json() for story in self.endpoints],
        }


async def read(conn: postgres.Connection, name: str) -> list[EventStory]:
    """The stories of the events ``name`` names (a message id or a reservation id), in
    one repeatable-read transaction; none when no event of that name is kept."""
    async with postgres.transaction(conn, isolation="repeatable_read", readonly=True):
        events = await log.events_of(conn, name)
        registered = {row["name"]: row["registered_at"] for row in await conn.fetch(REGISTERED)}
        stories = []
        for event in events:
            attempts = await log.attempts_of(conn, event.message_id)
            waiting = await log.waiting_of(conn, event.message_id)
            stories.append(EventStory(event, _endpoints(event, attempts, waiting, registered)))
    return stories


def _endpoints(
    event: log.Event,
    attempts: list[log.LoggedAttempt],
    waiting: list[log.Waiting],
    registered: dict[str, datetime],
) -> list[EndpointStory]:
    names = sorted({a.endpoint for a in attempts} | {w.endpoint for w in waiting} | {*registered})
    by_name = {w.endpoint: w for w in waiting}
    stories = []
    for name in names:
        own = [a for a in attempts if a.endpoint == name]
        pending = by_name.get(name)
        state = _state(event, own, pending, registered.get(name))
        stories.append(EndpointStory(name, state, own, pending))
    return stories


def _state(
    event: log.Event,
    attempts: list[log.LoggedAttempt],
    waiting: log.Waiting | None,
    registered_at: datetime | None,
) -> str:
    if waiting is not None:
        return "dead" if waiting.dead else "pending"
    if any(a.status is not None and 200 <= a.status < 300 for a in attempts):
        return "delivered"
    if registered_at is not None and registered_at > event.created_at:
        return "registered-later"
    return "nothing-recorded"


def _attempt_line(attempt: log.LoggedAttempt) -> str:
    answer = f"HTTP {attempt.status}" if attempt.status is not None else "no answer"
    error = f", {attempt.error_class}" if attempt.error_class else ""
    return (
        f"    {attempt.at.isoformat(timespec='milliseconds')}  #{attempt.attempt}  "
        f"{attempt.kind:9}  {answer}{error}, {attempt.duration_ms:.1f} ms, "
        f"by {attempt.deliverer}"
    )
