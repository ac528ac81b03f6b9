"""What the console's pages read: the overview, a page of dead letters with their groups,
one dead letter whole. The operations behind them are ``service/ops``', the same code
as the command line's."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from service.adapters import postgres
from service.adapters.postgres import console as console_store
from service.adapters.postgres.webhook_endpoints import EndpointBacklog
from service.core.durations import human
from service.core.topology import DEAD_QUEUE
from service.ops import dead_letters, screen, survey
from service.ops import health as ops_status
from service.settings import Settings

PAGE_SIZE = 50
STATUSES = ("dead", "closed", "replayed")
# The ages a listing filters by: label -> seconds since last seen.
AGES = {"1h": 3600.0, "1d": 86400.0, "7d": 7 * 86400.0}


@dataclass
class Overview:
    """The first page: is anything stuck, and where (the status command's verdict and
    problems, the same code deciding them)."""

    status: ops_status.Status

    @property
    def queues(self) -> list[screen.QueueRow]:
        return screen.queue_rows(self.status.queues)

    @property
    def passes(self) -> list[screen.PassRow]:
        return screen.pass_rows(self.status)

    @property
    def dead_letter_note(self) -> str | None:
        return screen.dead_letter_note(self.status)

    @property
    def dead_queue(self) -> str:
        return DEAD_QUEUE

    @property
    def oldest_due(self) -> str:
        backlog = self.status.backlog
        return "-" if backlog is None else human(backlog.oldest_due_age_seconds)

    @property
    def objective(self) -> str:
        return human(self.status.objective_seconds)

    @property
    def oldest_event(self) -> str:
        """The oldest pending event's age (``-``: none pending, or not read)."""
        events = self.status.events
        return "-" if events is None or not events.count else human(events.oldest_age_seconds)

    @property
    def events_objective(self) -> str:
        return human(self.status.events_objective_seconds)

    @property
    def webhooks(self) -> list[WebhookRow]:
        """Each webhook endpoint's deliveries and state."""
        objective = self.status.webhook_objective_seconds
        return [
            WebhookRow(
                endpoint=row.endpoint,
                pending=row.pending,
                oldest=human(row.oldest_age) if row.pending else "-",
                dead=row.dead,
                paused=row.paused_for > 0,
                behind=row.oldest_age > objective,
                state=_webhook_state(row, objective),
            )
            for row in self.status.webhooks or []
        ]


def _webhook_state(row: EndpointBacklog, objective: float) -> str:
    """One endpoint's state in a few words: disabled, paused, behind or delivering."""
    if row.disabled_at is not None:
        return f"DISABLED (410) since {row.disabled_at:%Y-%m-%d %H:%M}"
    if row.paused_for > 0:
        return f"paused {human(row.paused_for)}"
    return "BEHIND" if row.oldest_age > objective else "delivering"


@dataclass(frozen=True)
class WebhookRow:
    """One webhook endpoint as the overview shows it."""

    endpoint: str
    pending: int
    oldest: str
    dead: int
    paused: bool
    behind: bool
    state: str


async def read_overview(
    pool: postgres.Pool, settings: Settings, broker: AbstractRobustConnection | None
) -> Overview:
    """What the status command reads, the database through the console's pool and the
    broker through its connection (None: none open); neither one down, nor a database
    that is not migrated, stops the page."""
    opened = None if broker is None else contextlib.nullcontext(broker)
    return Overview(await survey.read_status(settings, pool.acquire(), opened))


@dataclass(frozen=True)
class Query:
    """A listing's filters, as the page's query string carries them (all untrusted)."""

    status: str = "dead"
    error_class: str | None = None
    give_up: str | None = None
    older_than: str | None = None  # one of AGES
    newer_than: str | None = None
    after: tuple[datetime, int] | None = None

    @classmethod
    def parse(cls, params: dict[str, str]) -> Query:
        """The filters of a query string; anything unknown is dropped, never an error."""
        status = params.get("status", "dead")
        return cls(
            status=status if status in (*STATUSES, "open", "all") else "dead",
            error_class=_short(params.get("error_class")),
            give_up=_short(params.get("give_up")),
            older_than=params.get("older_than") if params.get("older_than") in AGES else None,
            newer_than=params.get("newer_than") if params.get("newer_than") in AGES else None,
            after=_cursor(params.get("after")),
        )

    @property
    def statuses(self) -> tuple[str, ...]:
        if self.status == "open":
            return dead_letters.OPEN
        return STATUSES if self.status == "all" else (self.status,)

    def page(self) -> postgres.Page:
        """The data layer's page."""
        return postgres.Page(
            self.statuses,
            self.error_class,
            self.give_up,
            AGES.get(self.older_than or ""),
            AGES.get(self.newer_than or ""),
            self.after,
            PAGE_SIZE,
        )

    def params(self, **changes: str | None) -> dict[str, str]:
        """The query string of this listing with ``changes`` (None removes a filter)."""
        values: dict[str, str | None] = {
            "status": self.status,
            "error_class": self.error_class,
            "give_up": self.give_up,
            "older_than": self.older_than,
            "newer_than": self.newer_than,
        }
        values.update(changes)
        return {key: value for key, value in values.items() if value}


def _short(value: str | None) -> str | None:
    """A filter's text (blank: no filter, any)."""
    return (value.strip()[:100] or None) if value else None


def _cursor(value: str | None) -> tuple[datetime, int] | None:
    if not value or "," not in value:
        return None
    when, _, number = value.rpartition(",")
    try:
        return datetime.fromisoformat(when), int(number)
    except ValueError:
        return None


@dataclass
class Listing:
    """A page of dead letters, their groups, and where the next page starts."""

    query: Query
    groups: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    next_after: str | None = None


async def read_listing(conn: postgres.Connection, query: Query) -> Listing:
    """The groups (by error class, give-up reason and status) and one page, newest first."""
    groups = [dict(row) for row in await postgres.dead_letter_groups(conn, query.statuses)]
    rows = [dict(row) for row in await postgres.list_page(conn, query.page())]
    listing = Listing(query, groups, rows)
    if len(rows) == PAGE_SIZE:
        last = rows[-1]
        listing.next_after = f"{last['last_seen'].isoformat()},{last['id']}"
    return listing


@dataclass
class Plan:
    """What a replay will do to each selected dead letter (the dry run)."""

    rows: list[Any]
    expectations: dict[int, str]
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SessionRow:
    """An open session as the sessions page shows it (never its token)."""

    id: int
    operator: str
    client: str
    age: str
    idle: str
    current: bool


def session_row(row: Any, current: int) -> SessionRow:
    """A row of ``OPEN_SESSIONS`` for the page (``current``: the viewer's session)."""
    return SessionRow(
        row["id"],
        dead_letters.cell(row["operator"]),
        dead_letters.cell(row["client_host"]),
        human(row["age_seconds"]),
        human(row["idle_seconds"]),
        row["id"] == current,
    )


# Failed and refused logins the overview shows: those of the last day, newest first.
LOGIN_FAILURE_SECONDS = 86400.0
LOGIN_FAILURES_SHOWN = 10


@dataclass(frozen=True)
class LoginFailures:
    """Failed and refused logins of the last day: how many, and the newest."""

    count: int
    rows: list[dict[str, Any]]


async def read_login_failures(pool: postgres.Pool) -> LoginFailures | None:
    """The overview's login failures (None when the database cannot tell them)."""
    with contextlib.suppress(asyncpg.PostgresError, OSError, ConnectionError, TimeoutError):
        async with pool.acquire() as conn:
            count, rows = await console_store.failed_logins(
                conn, LOGIN_FAILURE_SECONDS, LOGIN_FAILURES_SHOWN
            )
        return LoginFailures(count, [dict(row) for row in rows])
    return None
