"""The crash counter of redelivered commands (``delivery_crashes``)."""

from __future__ import annotations

from service.adapters.postgres.pool import Connection

MARK_HANDLING = """
INSERT INTO delivery_crashes (message_id) VALUES ($1)
    ON CONFLICT (message_id) DO UPDATE
   SET handled = delivery_crashes.handled + 1, last_at = now()
RETURNING handled
"""


CLEAR_HANDLING = "DELETE FROM delivery_crashes WHERE message_id = $1"


async def mark_handling(conn: Connection, message_id: str) -> int:
    """Count one more attempt at a redelivered command; return how many there were."""
    handled: int = await conn.fetchval(MARK_HANDLING, message_id)
    return handled


async def clear_handling(conn: Connection, message_id: str) -> None:
    """The command was handled without a crash: forget its count."""
    await conn.execute(CLEAR_HANDLING, message_id)
