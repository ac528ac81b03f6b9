"""RabbitMQ: connections with node failover, confirmed publishing, settling deliveries."""

from service.adapters.amqp.connection import (
    SETTLE_ERRORS,
    ClusterConnection,
    SettleAction,
    connect,
    connection_url,
    open_confirm_channel,
    publish_confirmed,
    settle,
    settle_failed,
)

__all__ = [
    "SETTLE_ERRORS",
    "ClusterConnection",
    "SettleAction",
    "connect",
    "connection_url",
    "open_confirm_channel",
    "publish_confirmed",
    "settle",
    "settle_failed",
]
