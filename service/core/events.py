"""The ``reservation.expired`` event, as ../shared/CONTRACT.md ("Events") spells it:
pure, no I/O.

The database writes an event's row in the transaction of its expiry (migration
``0014_events``) with its message id; the relay publishes it with this body. A
reader deduplicates by the message id, and ignores fields it does not know.
"""

from __future__ import annotations

import json
from datetime import datetime
from uuid import UUID

from service.core.domain import epoch_millis

EVENT = "reservation.expired"
MESSAGE_ID_PREFIX = "expired:"


def event_message_id(reservation_id: UUID, hold_until: datetime) -> str:
    """The event's stable message id (the database makes the same: 0014_events)."""
    return f"{MESSAGE_ID_PREFIX}{reservation_id}:{epoch_millis(hold_until)}"


def event_body(reservation_id: UUID, hold_until: datetime, expired_at: datetime) -> bytes:
    """The event's JSON body: both times with their offset, ``expired_at`` the database's."""
    if hold_until.tzinfo is None or expired_at.tzinfo is None:
        raise ValueError("hold_until and expired_at must be timezone-aware")
    return json.dumps(
        {
            "event": EVENT,
            "reservation_id": str(reservation_id),
            "hold_until": hold_until.isoformat(),
            "expired_at": expired_at.isoformat(),
        },
        separators=(",", ":"),
    ).encode()
