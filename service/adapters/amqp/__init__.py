"""RabbitMQ: connections with node failover, confirmed publishing, settling deliveries."""

from service.adapters.amqp.connection import (
    CHANNEL_ERRORS,
    ClusterConnection,
    SettleAction,
    connect,
    connected,
    connection_url,
    not_confirmed_reason,
    open_confirm_channel,
    publish_confirmed,
    settle,
    settle_failed,
)

__all__ = [
    "CHANNEL_ERRORS",
    "ClusterConnection",
    "SettleAction",
    "connect",
    "connected",
    "connection_url",
    "not_confirmed_reason",
    "open_confirm_channel",
    "publish_confirmed",
    "settle",
    "settle_failed",
]
