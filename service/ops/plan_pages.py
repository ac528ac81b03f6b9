"""The replay of one endpoint's dead webhook deliveries (``replay --all --endpoint NAME``),
past PLAN_LIMIT: up to ENDPOINT_PLAN_LIMIT, a page at a time, exactly as planned.

A receiver's outage leaves thousands of dead deliveries to one endpoint. Their plan is
made as any group's (``plans.plan``: the listing is one snapshot, and the dry run says
exactly how many it holds), and confirming it acts on exactly the planned records, as
``plans.confirm`` does, but a page (``dead_letter_pages.PAGE`` records) per
transaction: each planned record still at the revision the dry run saw is claimed, its
delivery made due again (no broker: the deliverers send it, with its ``webhook-id``),
and its replay audited and the record marked replayed, in the page's transaction. A
record changed since, or gone, is left out and named (what changed: ``plan_changes``);
the group's members that the plan does not list (arrived since, or dead-lettered again
since) are left out, the first PLAN_LIMIT named and the rest counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from service.adapters import postgres
from service.adapters.postgres import dead_letter_pages as pages
from service.adapters.postgres import revisions, webhook_endpoints
from service.core import webhook_policy
from service.ops import dead_letters, plan_changes, plans
from service.ops.dead_letters import cell
from service.ops.replay import ReplayResult, report_lines
from service.settings import Settings

log = logging.getLogger("service.deadletters")

# Lines shown of a dry run or a replay, one per dead letter; the count covers them all.
SHOWN_LIMIT = plans.PLAN_LIMIT
ARRIVED = "not in the dry run: not replayed (it arrived since, or was dead-lettered again)"


def paged(planned: plans.Plan) -> bool:
    """Whether ``planned`` is replayed a page at a time: one endpoint's group."""
    group = planned.selection.group
    return planned.act == "replay" and group is not None and group.endpoint is not None


def shown_lines(results: list[ReplayResult], *, dry_run: bool) -> list[str]:
    """``replay.report_lines``, with at most SHOWN_LIMIT lines of dead letters (the
    counts cover them all; ``--json`` lists each)."""
    lines = report_lines(results, dry_run=dry_run)
    if len(results) <= SHOWN_LIMIT:
        return lines
    hidden = len(results) - SHOWN_LIMIT
    return [
        *lines[:SHOWN_LIMIT],
        f"... and {hidden} more, not shown (--json lists every one)",
        lines[-1],
    ]


async def tail_lines(conn: postgres.Connection, planned: plans.Plan) -> list[str]:
    """``plans.tail_lines``, and, when an endpoint's group is empty and no endpoint of that
    name is registered, that its name selects nothing."""
    lines = plans.tail_lines(planned)
    group = planned.selection.group
    if planned.items or group is None or group.endpoint is None:
        return lines
    if not await webhook_endpoints.is_registered(conn, group.endpoint):
        lines.append(
            f"no endpoint {cell(group.endpoint)!r} is registered: the name selects nothing"
        )
    return lines


async def replay(
    conn: postgres.Connection, settings: Settings, planned: plans.Plan, actor: postgres.Actor
) -> tuple[list[ReplayResult], plans.Confirmed]:
    """Replay exactly the planned dead letters still as the dry run saw them, a page per
    transaction; the rest, and the group's newcomers, left out and named (or counted)."""
    group = planned.selection.group
    assert group is not None  # paged(planned)
    replaying = _Replaying(conn, settings, planned, actor)
    for start in range(0, len(planned.items), pages.PAGE):
        async with postgres.transaction(conn):
            await replaying.page(planned.items[start : start + pages.PAGE])
    done, changed = replaying.done, replaying.changed
    said = await plan_changes.explain(conn, planned.at, changed)
    done.left_out += [plans.LeftOut(r["id"], r["message_id"], said[r["id"]]) for r in changed]
    planned_ids = [item.id for item in planned.items]
    named, total = await pages.not_planned(
        conn, group.members("replay"), planned_ids, plans.PLAN_LIMIT
    )
    done.left_out += [plans.LeftOut(r["id"], r["message_id"], ARRIVED) for r in named]
    done.unnamed = total - len(named)
    return replaying.results, done


@dataclass
class _Replaying:
    """A paged replay under way: what it did so far."""

    conn: postgres.Connection
    settings: Settings
    planned: plans.Plan
    actor: postgres.Actor
    results: list[ReplayResult] = field(default_factory=list)
    done: plans.Confirmed = field(default_factory=plans.Confirmed)
    changed: list[asyncpg.Record] = field(default_factory=list)  # explained at the end

    async def page(self, page: Sequence[plans.Planned]) -> None:
        """One page, in the caller's transaction: the planned records still as they were
        claimed, revived and audited; the others left out (or kept to be explained)."""
        ids = [item.id for item in page]
        now = {row["id"]: row for row in await revisions.by_ids(self.conn, ids)}
        fit: list[tuple[Any, str]] = []
        for item in page:
            row = now.get(item.id)
            why = plans.unfit(row, item, "replay", self.planned.selection.group, set())
            if row is not None and row["revision"] != item.revision:
                self.changed.append(row)
            elif why is None:
                fit.append((row, item.revision))
            else:
                shown = row["message_id"] if row is not None else "-"
                self.done.left_out.append(plans.LeftOut(item.id, shown, why))
        if not fit:
            return
        claimed = await pages.claim(self.conn, [(row["id"], rev) for row, rev in fit])
        for row, _rev in fit:
            if row["id"] not in claimed:
                why = "changed while it was being confirmed"
                self.done.left_out.append(plans.LeftOut(row["id"], row["message_id"], why))
        rows = [row for row, _rev in fit if row["id"] in claimed]
        self.done.rows += rows
        if rows:
            self.results += await self._redeliver(rows)

    async def _redeliver(self, rows: list[Any]) -> list[ReplayResult]:
        """The claimed records' deliveries due again, and each replay audited (as
        ``replay._redeliver`` does one at a time)."""
        expected = await dead_letters.expectations(self.conn, rows, self.settings)
        keys = {row["id"]: _key(row) for row in rows}
        revived = await pages.revive(self.conn, list(keys.values()))
        results = []
        for row in rows:
            endpoint, _event = keys[row["id"]]
            if keys[row["id"]] in revived:
                outcome = postgres.REDELIVERING
                detail = f"due again to {endpoint}; {expected[row['id']]}"
            else:
                outcome, detail = "not-in-queue", f"no dead delivery of it to {endpoint}"
            results.append(ReplayResult(row["id"], row["message_id"], outcome, detail))
        audited = [pages.Audited(r.record_id, r.message_id, r.outcome, r.detail) for r in results]
        await pages.record_replays(self.conn, audited, self.actor)
        log.info(
            "deadletter.replay_page",
            extra={"operator": self.actor.operator, "count": len(results), "revived": len(revived)},
        )
        return results


def _key(row: Any) -> tuple[str, str]:
    key = webhook_policy.of_dead_letter_key(str(row["message_id"]))
    assert key is not None  # an endpoint's group holds its deliveries' dead letters alone
    return key
