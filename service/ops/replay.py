"""Replaying dead letters: republished with confirms, only then taken off the dead queue.

A replay republishes the command with the same message id and a fresh
attempt budget, with publisher confirms, and only then removes it from
``expirations.dead``, with any other copy of it the queue holds; every other
message taken from that queue on the way is given back (``dead_queue.py``). A
dead letter no longer in the queue is rebuilt from its record when it can be.
Each one's outcome is audited. Replaying a hold that has since been consumed
or expired is harmless: the guarded update makes it a no-op.

A webhook delivery's dead letter (``webhook:<endpoint>:<event id>``) is not in the
broker: replaying it makes its delivery due again, with fresh attempts and age, and the
deliverer sends it with the same ``webhook-id``.

What is replayed is decided before: the records handed in were planned and
claimed (``plans.py``), so a replay acts on exactly what its dry run showed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from service.adapters import amqp, postgres
from service.adapters.amqp import messages
from service.adapters.postgres import deliveries as webhook_rows
from service.adapters.telemetry import propagation
from service.core import webhook_policy
from service.core.dead_letter import REPLAY_OF_HEADER, REPLAYED_BY_HEADER
from service.core.domain import command_body
from service.core.errors import PublishNotConfirmed
from service.core.topology import ROUTING_KEY
from service.ops.dead_letters import cell
from service.ops.dead_queue import Copy, DeadQueue
from service.settings import Settings

log = logging.getLogger("service.deadletters")

Row = asyncpg.Record | Mapping[str, Any]


@dataclass
class ReplayResult:
    """What happened to one selected dead letter."""

    record_id: int
    message_id: str
    outcome: str  # REPLAYED, not-in-queue, publish-failed, would-republish, would-redeliver
    detail: str

    def as_json(self) -> dict[str, Any]:
        """The machine form."""
        return {
            "id": self.record_id,
            "message_id": self.message_id,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def dry_run(rows: list[Any], expectations: dict[int, str]) -> list[ReplayResult]:
    """What a replay would do, changing nothing."""
    return [
        ReplayResult(
            r["id"],
            r["message_id"],
            "would-redeliver" if _delivery_of(r) else "would-republish",
            expectations[r["id"]],
        )
        for r in rows
    ]


def _delivery_of(row: Row) -> tuple[str, str] | None:
    """The endpoint and event id of a webhook delivery's dead letter (None: a command's)."""
    return webhook_policy.of_dead_letter_key(str(row["message_id"]))


def report_lines(results: list[ReplayResult], *, dry_run: bool) -> list[str]:
    """One line per dead letter, then the counts by outcome."""
    lines = [
        f"{r.outcome:16} #{r.record_id}  {cell(r.message_id)}  ({cell(r.detail)})" for r in results
    ]
    counts = {o: sum(r.outcome == o for r in results) for o in sorted({r.outcome for r in results})}
    lines.append(
        f"replay{' (dry run)' if dry_run else ''}: {len(results)} selected"
        + "".join(f", {n} {o}" for o, n in counts.items())
    )
    return lines


def any_failed(results: list[ReplayResult]) -> bool:
    """Whether a republish was not confirmed."""
    return any(r.outcome == "publish-failed" for r in results)


def needs_broker(rows: list[Any]) -> bool:
    """Whether replaying ``rows`` republishes a command (a webhook delivery needs none)."""
    return any(not _delivery_of(row) for row in rows)


async def replay(
    settings: Settings,
    conn: postgres.Connection,
    connection: AbstractRobustConnection | None,
    rows: list[Any],
    actor: postgres.Actor,
    expectations: dict[int, str],
) -> list[ReplayResult]:
    """Replay ``rows`` (authorised and claimed): a command from the dead queue, else from
    its record; a webhook delivery made due again."""
    results = [
        await _redeliver(conn, row, actor, expectations) for row in rows if _delivery_of(row)
    ]
    rows = [row for row in rows if not _delivery_of(row)]
    if not rows:
        return results
    if connection is None:
        raise ValueError("replaying a command needs a broker connection")
    async with DeadQueue.walk(settings, connection) as dead:
        replayer = Replayer(settings, conn, dead, actor, expectations)
        from_queue = await replayer.from_queue({row["message_id"]: row for row in rows})
        found = {result.record_id for result in from_queue}
        results += from_queue
        for row in rows:
            if row["id"] not in found:
                results.append(await replayer.from_record(row))
    return results


async def _redeliver(
    conn: postgres.Connection, row: Row, actor: postgres.Actor, expectations: dict[int, str]
) -> ReplayResult:
    """A webhook delivery's dead letter: its delivery due again (same webhook-id)."""
    key = _delivery_of(row)
    assert key is not None
    endpoint, message_id = key
    if await webhook_rows.revive(conn, endpoint, message_id):
        outcome, detail = (
            postgres.REDELIVERING,
            f"due again to {endpoint}; {expectations[row['id']]}",
        )
    else:
        outcome, detail = "not-in-queue", f"no dead delivery of it to {endpoint}"
    await postgres.record_replay(
        conn, row["id"], row["message_id"], actor=actor, outcome=outcome, detail=detail
    )
    log.info(
        "deadletter.replay",
        extra={"message_id": row["message_id"], "operator": actor.operator, "outcome": outcome},
    )
    return ReplayResult(row["id"], row["message_id"], outcome, detail)


@dataclass(eq=False)
class Replayer:
    """Republishes dead letters with confirms, then removes and audits them."""

    settings: Settings
    conn: postgres.Connection
    dead: DeadQueue
    actor: postgres.Actor
    expectations: dict[int, str]

    async def from_queue(self, wanted: dict[str, Row]) -> list[ReplayResult]:
        """Take each message of the dead queue once: replay the first copy of each wanted
        dead letter, remove its other copies once it is republished, give back the rest."""
        results: dict[str, ReplayResult] = {}
        others: list[Copy] = []
        for copy in await self.dead.take_all():
            row = wanted.get(copy.key)
            first = results.get(copy.key)
            if row is None:
                others.append(copy)
            elif first is None:
                results[copy.key] = await self._republish(row, copy.message.body, copy)
            elif first.outcome == postgres.REPUBLISHED and copy.last_seen <= row["last_seen"]:
                await self.dead.remove(copy)  # another copy of the command just replayed
            else:
                others.append(copy)
        for copy in others:
            await self.dead.give_back(copy)
        return list(results.values())

    async def from_record(self, row: Row) -> ReplayResult:
        """The message is not in the dead queue: rebuild it from the record if it can be."""
        if row["reservation_id"] is None or row["hold_until"] is None:
            return await self._audit(
                row, "not-in-queue", "not in expirations.dead and no command to rebuild"
            )
        body = command_body(row["reservation_id"], row["hold_until"])
        return await self._republish(row, body, None)

    async def _republish(self, row: Row, body: bytes, original: Copy | None) -> ReplayResult:
        headers = {REPLAYED_BY_HEADER: self.actor.operator}
        # The replay is a job of its own (its own trace), linked to the one it replays.
        replay_of = (
            None if original is None else propagation.traceparent_of(original.message.headers)
        )
        if replay_of is not None:
            headers[REPLAY_OF_HEADER] = replay_of
        message = messages.command(body, row["message_id"], headers=headers)
        try:
            await amqp.publish_confirmed(
                self.dead.exchange,
                message,
                ROUTING_KEY,
                timeout=self.settings.publish_timeout_seconds,
            )
        except PublishNotConfirmed as exc:
            if original is not None:
                await self.dead.give_back(original)
            return await self._audit(row, "publish-failed", str(exc))
        # Only now, with the copy confirmed, does the dead letter leave its queue.
        if original is not None:
            await self.dead.remove(original)
        source = "rebuilt from the record" if original is None else "from expirations.dead"
        detail = f"{source}; {self.expectations[row['id']]}"
        return await self._audit(row, postgres.REPUBLISHED, detail)

    async def _audit(self, row: Row, outcome: str, detail: str) -> ReplayResult:
        await postgres.record_replay(
            self.conn,
            row["id"],
            row["message_id"],
            actor=self.actor,
            outcome=outcome,
            detail=detail,
        )
        log.info(
            "deadletter.replay",
            extra={
                "message_id": row["message_id"],
                "operator": self.actor.operator,
                "outcome": outcome,
            },
        )
        return ReplayResult(row["id"], row["message_id"], outcome, detail)
