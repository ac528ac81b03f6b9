"""Replaying dead letters: republished with confirms, only then taken off the dead queue.

A replay republishes the command with the same message id and a fresh
attempt budget, with publisher confirms, and only then removes it from
``expirations.dead``; every other message taken from that queue on the way is
given back. A dead letter no longer in the queue is rebuilt from its record
when it can be. Each one's outcome is audited. Replaying a hold that has since
been consumed or expired is harmless: the guarded update makes it a no-op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg
from aio_pika.abc import (
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from service.adapters import amqp, postgres
from service.adapters.amqp import messages
from service.adapters.amqp.returns import give_back
from service.core.dead_letter import REPLAYED_BY_HEADER, stable_message_id
from service.core.domain import command_body
from service.core.errors import PublishNotConfirmed
from service.core.topology import DEAD_EXCHANGE, DEAD_QUEUE, EXCHANGE, ROUTING_KEY
from service.ops.dead_letters import cell
from service.settings import Settings

log = logging.getLogger("service.deadletters")


@dataclass
class ReplayResult:
    """What happened to one selected dead letter."""

    record_id: int
    message_id: str
    outcome: str  # republished, not-in-queue, publish-failed, would-republish
    detail: str


def dry_run(rows: list[asyncpg.Record], expectations: dict[int, str]) -> list[ReplayResult]:
    """What a replay would do, changing nothing."""
    return [
        ReplayResult(r["id"], r["message_id"], "would-republish", expectations[r["id"]])
        for r in rows
    ]


def report_lines(results: list[ReplayResult], *, dry_run: bool) -> list[str]:
    """One line per dead letter, then the counts by outcome."""
    lines = [
        f"{r.outcome:16} #{r.record_id}  {cell(r.message_id)}  ({cell(r.detail)})" for r in results
    ]
    counts = {o: sum(r.outcome == o for r in results) for o in sorted({r.outcome for r in results})}
    lines.append(
        f"replay{' (dry run)' if dry_run else ''}: {len(results)} selected, "
        + ", ".join(f"{n} {o}" for o, n in counts.items())
    )
    return lines


def any_failed(results: list[ReplayResult]) -> bool:
    """Whether a republish was not confirmed."""
    return any(r.outcome == "publish-failed" for r in results)


async def replay(
    settings: Settings,
    conn: postgres.Connection,
    connection: AbstractRobustConnection,
    rows: list[asyncpg.Record],
    actor: postgres.Actor,
    expectations: dict[int, str],
) -> list[ReplayResult]:
    """Replay ``rows`` (already authorised): from the dead queue, else from their records."""
    publish_channel = await amqp.open_confirm_channel(connection)
    exchange = await publish_channel.get_exchange(EXCHANGE, ensure=False)
    dead_exchange = await publish_channel.get_exchange(DEAD_EXCHANGE, ensure=False)
    get_channel = await connection.channel(publisher_confirms=False)
    dead = await get_channel.get_queue(DEAD_QUEUE, ensure=True)
    replayer = Replayer(settings, conn, exchange, dead_exchange, actor, expectations)
    results = await replayer.from_queue(dead, {row["message_id"]: row for row in rows})
    found = {result.record_id for result in results}
    for row in rows:
        if row["id"] not in found:
            results.append(await replayer.from_record(row))
    return results


class Replayer:
    """Republishes dead letters with confirms, then removes and audits them."""

    def __init__(
        self,
        settings: Settings,
        conn: postgres.Connection,
        exchange: AbstractExchange,
        dead_exchange: AbstractExchange,
        actor: postgres.Actor,
        expectations: dict[int, str],
    ) -> None:
        self.settings = settings
        self.conn = conn
        self.exchange = exchange
        self.dead_exchange = dead_exchange
        self.actor = actor
        self.expectations = expectations

    async def from_queue(
        self, dead: AbstractQueue, wanted: dict[str, asyncpg.Record]
    ) -> list[ReplayResult]:
        """Take each message of the dead queue once; replay the wanted, give back the rest."""
        depth = (await dead.declare()).message_count or 0
        results: list[ReplayResult] = []
        others: list[AbstractIncomingMessage] = []
        for _ in range(depth):
            message = await dead.get(
                no_ack=False, fail=False, timeout=self.settings.publish_timeout_seconds
            )
            if message is None:
                break
            row = wanted.get(stable_message_id(message.message_id, message.body))
            if row is None or row["id"] in {r.record_id for r in results}:
                others.append(message)
                continue
            results.append(await self._republish(row, message.body, message))
        for message in others:
            await self._give_back(message)
        return results

    async def from_record(self, row: asyncpg.Record) -> ReplayResult:
        """The message is not in the dead queue: rebuild it from the record if it can be."""
        if row["reservation_id"] is None or row["hold_until"] is None:
            return await self._audit(
                row, "not-in-queue", "not in expirations.dead and no command to rebuild"
            )
        body = command_body(row["reservation_id"], row["hold_until"])
        return await self._republish(row, body, None, rebuilt=True)

    async def _republish(
        self,
        row: asyncpg.Record,
        body: bytes,
        original: AbstractIncomingMessage | None,
        *,
        rebuilt: bool = False,
    ) -> ReplayResult:
        message = messages.command(
            body, row["message_id"], headers={REPLAYED_BY_HEADER: self.actor.operator}
        )
        try:
            await amqp.publish_confirmed(
                self.exchange, message, ROUTING_KEY, timeout=self.settings.publish_timeout_seconds
            )
        except PublishNotConfirmed as exc:
            if original is not None:
                await self._give_back(original)
            return await self._audit(row, "publish-failed", str(exc))
        # Only now, with the copy confirmed, does the dead letter leave its queue.
        if original is not None:
            await amqp.settle(original.ack, row["message_id"])
        source = "rebuilt from the record" if rebuilt else "from expirations.dead"
        return await self._audit(row, "republished", f"{source}; {self.expectations[row['id']]}")

    async def _give_back(self, message: AbstractIncomingMessage) -> None:
        """Return a message to expirations.dead (a fresh copy once it was returned often)."""
        await give_back(
            message,
            dead_exchange=self.dead_exchange,
            queue=DEAD_QUEUE,
            timeout=self.settings.publish_timeout_seconds,
        )

    async def _audit(self, row: asyncpg.Record, outcome: str, detail: str) -> ReplayResult:
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
