"""One demo run, step by step: sandbox, migrate and declare, consumers and the scan, holds,
watching, SIGTERM, the summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from service.adapters import amqp, postgres
from service.adapters.amqp.queues import QueueProbe
from service.cli import stop_on_signals
from service.core.redaction import redact_url
from service.declare import declare
from service.demo.children import STOP_TIMEOUT_SECONDS, Child, Children, tail
from service.demo.plan import Plan, plan_from
from service.demo.summary import Report, delivery_outcomes, final_state, summary
from service.demo.support import Support, place_holds, support_side
from service.demo.watch import Queues, watch
from service.demo.workspace import Sandbox, amqp_url, database_url, own_settings, sandbox_for
from service.settings import Settings

NAME = "expiry-demo"
SUPPORT_POOL_SIZE = 4


def say(text: str) -> None:
    """One line of the demo's own story, on stdout."""
    print(text, flush=True)


async def demo(settings: Settings, args: argparse.Namespace) -> int:
    """The whole run; 0 only if every check passed."""
    plan = plan_from(args)
    logs = Path(tempfile.mkdtemp(prefix=f"{plan.name}-logs-"))
    with stop_on_signals(asyncio.Event()) as stop:
        introduce(plan, settings, logs)
        async with sandbox_for(settings, plan) as sandbox:
            report = await Run(plan, settings, sandbox, logs, stop).report()
        say(f"\nsummary ({plan.name})")
        for line in summary(report):
            say(line)
        say(f"RESULT: {'OK' if report.ok else 'FAILED'}")
        farewell(plan, logs, ok=report.ok)
    return 0 if report.ok else 1


def introduce(plan: Plan, settings: Settings, logs: Path) -> None:
    """What the run will do, and where."""
    say(
        f"expiry-service demo: {plan.holds} holds, {plan.consumers} consumers, "
        f"a scan every {plan.scan_every:g}s"
    )
    say(f"  database  {redact_url(database_url(settings, plan))}")
    say(f"  vhost     {plan.name} on {redact_url(amqp_url(settings, plan))}")
    say(f"  logs      {logs}")


def farewell(plan: Plan, logs: Path, *, ok: bool) -> None:
    """What was removed, or kept."""
    name = plan.name
    if plan.keep:
        say(f"kept for inspection: database {name}, vhost {name}, logs {logs}")
        say(f"  remove them with: DROP DATABASE {name}; DELETE /api/vhosts/{name}")
        return
    say(f"removed the database and the vhost {name}")
    if ok:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        say(f"the processes' logs are kept in {logs}")


async def _wait_for_consumers(children: Children, queues: Queues, count: int) -> None:
    async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
        while await queues.consumers() < count:
            if dead := children.dead():
                raise RuntimeError(f"{dead[0].name} exited: {tail(dead[0].log)}")
            await asyncio.sleep(0.2)


async def _finish(support: asyncio.Task[None]) -> None:
    if not support.done():
        support.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await support


@dataclass
class Run:
    """One demo run, in a created sandbox."""

    plan: Plan
    settings: Settings
    sandbox: Sandbox
    logs: Path
    stop: asyncio.Event
    rng: random.Random = field(default_factory=random.Random)

    async def report(self) -> Report:
        """Run every step; what the summary shows."""
        started = time.monotonic()
        children = Children(self.sandbox, self.settings.management_url, self.logs)
        own = own_settings(self.settings, self.sandbox)
        say("[1/5] migrate (python -m service.migrate), declare the topology (service.declare)")
        await children.run("migrate", "service.migrate")
        topology = await declare(own)
        async with contextlib.AsyncExitStack() as stack:
            connection = await stack.enter_async_context(amqp.connected(own, name=NAME))
            conn = await stack.enter_async_context(postgres.connected(own, name=NAME))
            pool = await stack.enter_async_context(
                postgres.pooled(own, name=f"{NAME}-support", size=SUPPORT_POOL_SIZE)
            )
            stack.push_async_callback(children.stop, children.running)  # first to run
            queues = Queues(QueueProbe(connection), topology)
            settled, support, codes = await self._pipeline(children, conn, pool, queues)
            final = await final_state(conn, queues)
        outcomes = await asyncio.to_thread(delivery_outcomes, self.logs.glob("consumer-*.log"))
        return Report(settled, time.monotonic() - started, final, support, codes, outcomes)

    async def _pipeline(
        self,
        children: Children,
        conn: postgres.Connection,
        pool: postgres.Pool,
        queues: Queues,
    ) -> tuple[bool, Support, dict[str, int]]:
        running = await self._start_service(children, queues)
        support, done_by_support = await self._place_holds(conn, pool)
        say("[5/5] watching: held (due, oldest due age) / expired / consumed / retrying / dead")
        plan = self.plan
        deadline = time.monotonic() + plan.lead + plan.spread + plan.timeout
        settled = await watch(
            conn,
            queues,
            support.done,
            lambda: self.stop.is_set() or time.monotonic() > deadline or bool(children.dead()),
        )
        if self.stop.is_set():
            say("interrupted: stopping")
        codes = await children.stop(running)
        say(f"stopped with SIGTERM: {', '.join(f'{n} exit {c}' for n, c in codes.items())}")
        await _finish(support)
        return settled, done_by_support, codes

    async def _start_service(self, children: Children, queues: Queues) -> list[Child]:
        """The consumers (attached), then the scan: the scan first in the list."""
        plan = self.plan
        say(f"[2/5] {plan.consumers} consumers (python -m service.consume)")
        consumers = [
            await children.start(
                f"consumer-{i}", "service.consume", EXPIRY_WORKER_ID=f"demo-consumer-{i}"
            )
            for i in range(1, plan.consumers + 1)
        ]
        await _wait_for_consumers(children, queues, plan.consumers)
        say(f"[3/5] the scan, every {plan.scan_every:g}s (python -m service.produce --every)")
        scanner = await children.start("scan", "service.produce", "--every", f"{plan.scan_every}")
        return [scanner, *consumers]

    async def _place_holds(
        self, conn: postgres.Connection, pool: postgres.Pool
    ) -> tuple[asyncio.Task[None], Support]:
        """Place the holds; start the support side on its picks."""
        plan = self.plan
        holds = await place_holds(conn, plan)
        picks = self.rng.sample(holds, round(len(holds) * plan.support_share))
        say(
            f"[4/5] placed {len(holds)} holds due {plan.lead:g}-{plan.lead + plan.spread:g}s "
            f"from now; the support side consumes {len(picks)} of them at their deadline"
        )
        done_by_support = Support()
        support = asyncio.create_task(support_side(pool, picks, self.rng, done_by_support))
        return support, done_by_support
