"""The 2xx answers of a courier, recorded in batches (``service.deliver.receipts``): one
answer alone is written at once; those that come while a batch is being written go
together in the next; each is counted delivered, or (its lease lapsed) said and counted
as a lapse; a statement that fails makes each of its batch a lapse, and the next batch
is written all the same. The statement itself, against PostgreSQL:
tests/integration/test_webhooks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from service.adapters import postgres
from service.adapters.postgres import deliveries as rows
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.deliver.receipts import Receipts


class FakeConnection:
    """Answers ``delivered_all``'s statement: every id but the lapsed ones; each call
    waits for ``release`` (a round trip the test lets end)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.lapsed: set[int] = set()
        self.failing = False
        self.release = asyncio.Event()

    async def fetch(self, query: str, *args: Any) -> list[dict[str, int]]:
        assert query == rows.DELIVERED
        ids, token = args[-2], args[-1]
        assert isinstance(token, uuid.UUID)
        assert all(len(column) == len(ids) for column in args[:-2])
        self.batches.append(list(ids))
        await self.release.wait()
        if self.failing:
            raise ConnectionResetError("the database went away")
        return [{"id": delivery_id} for delivery_id in ids if delivery_id not in self.lapsed]


class FakePool:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[FakeConnection]:
        yield self.conn


def _delivery(delivery_id: int) -> rows.Delivery:
    now = datetime.now(UTC)
    return rows.Delivery(
        delivery_id, f"expired:{delivery_id}", uuid.uuid4(), now, now, None, 0, 0.1
    )


def _attempted(delivery_id: int) -> rows.Attempted:
    return rows.Attempted(
        endpoint="orders",
        message_id=f"expired:{delivery_id}",
        number=1,
        kind=rows.AUTOMATIC,
        status=200,
        error_class=None,
        duration_ms=1.0,
        deliverer="test",
    )


def _receipts() -> tuple[Receipts, FakeConnection, InMemoryMetricReader]:
    conn, reader = FakeConnection(), InMemoryMetricReader()
    metrics = DeliverMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"))
    pool = cast(postgres.Pool, FakePool(conn))
    return Receipts("orders", pool, metrics, uuid.uuid4()), conn, reader


def _add(receipts: Receipts, *ids: int) -> None:
    for delivery_id in ids:
        receipts.add(_delivery(delivery_id), _attempted(delivery_id))


def _counted(reader: InMemoryMetricReader) -> dict[str, object]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: sum(getattr(point, "value", 0) for point in metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name in ("expiry.webhook.delivered", "expiry.webhook.leases_lapsed")
    }


async def test_answers_that_come_during_a_write_go_together_in_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receipts, conn, reader = _receipts()
    _add(receipts, 1)
    await asyncio.sleep(0)  # the first batch is being written
    assert conn.batches == [[1]]
    conn.lapsed = {3}
    _add(receipts, 2, 3, 4)
    assert conn.batches == [[1]]  # they wait for the batch in progress
    conn.release.set()
    with caplog.at_level(logging.WARNING, logger="service.deliver"):
        await receipts.written()
    assert conn.batches == [[1], [2, 3, 4]]  # one statement for the three
    assert (receipts.writing, receipts.waiting) == (None, [])
    assert _counted(reader) == {
        "expiry.webhook.delivered": 3,
        "expiry.webhook.leases_lapsed": 1,
    }
    [lapsed] = [r for r in caplog.records if r.getMessage() == "webhook.lease_lapsed"]
    assert lapsed.__dict__["message_id"] == "expired:3"


async def test_a_failed_statement_is_a_lapse_of_its_batch_and_the_next_is_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receipts, conn, reader = _receipts()
    conn.failing = True
    _add(receipts, 1, 2)
    conn.release.set()
    with caplog.at_level(logging.WARNING, logger="service.deliver"):
        await receipts.written()
    failed = [r for r in caplog.records if r.getMessage() == "webhook.settle_failed"]
    assert [r.__dict__["message_id"] for r in failed] == ["expired:1", "expired:2"]
    assert failed[0].__dict__["error_class"] == "ConnectionResetError"
    conn.failing = False
    _add(receipts, 3)
    await receipts.written()
    assert conn.batches == [[1, 2], [3]]
    assert _counted(reader) == {
        "expiry.webhook.delivered": 1,
        "expiry.webhook.leases_lapsed": 2,
    }
