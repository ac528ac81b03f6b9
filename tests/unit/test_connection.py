"""Connecting to the broker: a node that accepts and closes counts as unreachable."""

from __future__ import annotations

import pytest
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
