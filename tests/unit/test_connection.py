"""Connecting to the broker: a node that accepts and closes counts as unreachable; a lost
connection moves to the next node of the cluster."""

from __future__ import annotations

import logging
from typing import NoReturn

import pytest
from aio_pika.abc import UnderlayConnection
from yarl import URL

from service.adapters.amqp import connection
from service.adapters.amqp.connection import ClusterConnection
from tests.support import stack_settings


@pytest.mark.parametrize("error", [StopAsyncIteration, EOFError, ConnectionResetError])
async def test_a_node_that_closes_during_the_handshake_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    """aiormq's handshake raises StopAsyncIteration when the peer closed before its first
    frame: the command says it cannot reach RabbitMQ (naming no password), as for a
    refused port, after trying every node."""
    tried: list[URL] = []

    async def closes(url: URL, _timeout: float) -> ClusterConnection:
        tried.append(url)
        raise error()

    monkeypatch.setattr(connection, "_connect_node", closes)
    settings = stack_settings("postgresql://u@h/d", "amqp://user:secret@one:5672/v").model_copy(
        update={"amqp_url": ("amqp://user:secret@one:5672/v", "amqp://user:secret@two:5672/v")}
    )
    with pytest.raises(ConnectionError, match="cannot reach RabbitMQ at") as raised:
        await connection.connect(settings, name="test")
    assert [url.host for url in tried] == ["one", "two"]
    assert "secret" not in str(raised.value)


NODES = (URL("amqp://one:5672/"), URL("amqp://two:5672/"), URL("amqp://three:5672/"))


async def test_a_lost_connection_moves_to_the_next_node_and_a_closed_one_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aio-pika's close callbacks (run before it reconnects) move a lost connection to the
    next node, round the list; once we closed it, they move it nowhere."""
    caplog.set_level(logging.WARNING, logger=connection.__name__)
    cluster = ClusterConnection(NODES[0])
    cluster.use_nodes(NODES, 0)
    seen = []
    for _ in NODES:
        await cluster.close_callbacks(ConnectionResetError())
        seen.append(cluster.url.host)
    assert seen == ["two", "three", "one"]
    await cluster.close()
    await cluster.close_callbacks(None)
    assert cluster.url.host == "one"
    assert [r.getMessage() for r in caplog.records] == ["broker.next_node"] * 3


async def test_aio_pika_connects_to_the_url_the_connection_moved_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The touchpoint the move relies on: aio-pika connects to ``url`` as it is at the
    attempt, not as it was given."""
    tried: list[str | None] = []

    async def refuse(_cls: object, url: URL, /, *_args: object, **_kwargs: object) -> NoReturn:
        tried.append(url.host)
        raise ConnectionRefusedError()

    monkeypatch.setattr(UnderlayConnection, "connect", classmethod(refuse))
    cluster = ClusterConnection(NODES[0])
    cluster.use_nodes(NODES, 0)
    try:
        await cluster.close_callbacks(ConnectionResetError())
        with pytest.raises(ConnectionRefusedError):
            await cluster.connect(timeout=5)
    finally:
        await cluster.close()
    assert tried == ["two"]
