"""The same job done by Dramatiq, as a peer for the benchmark (the ``peer`` extra).

One actor runs one guarded update per message with its audit row, in a transaction of
its own (psycopg, a connection per worker thread), and Dramatiq acks the message after
the actor returns, so after the commit: at-least-once delivery and an idempotent,
guarded transition, as the service does. Dramatiq's default worker runs it
(``python -m dramatiq bench.peer``: a process per core, 8 threads each).

``python -m bench.peer enqueue`` sends one message per due held reservation, with
publisher confirms. ``DATABASE_URL`` and ``AMQP_URL`` say where.
"""

from __future__ import annotations

import os
import sys
import threading

import dramatiq
import psycopg
from dramatiq.brokers.rabbitmq import RabbitmqBroker

QUEUE = "bench_peer"
WORKER = "dramatiq-peer"

# The service's guarded transition (service/adapters/postgres/reservations.py), for
# psycopg's placeholders: only a held, due reservation moves, and only the winner
# writes its audit row.
EXPIRE = """
WITH expired AS (
    UPDATE reservations SET status = 'expired', updated_at = now()
     WHERE id = %(id)s AND status = 'held' AND hold_until <= now()
 RETURNING id
)
INSERT INTO reservation_transitions
       (reservation_id, from_status, to_status, message_id, attempt, worker)
SELECT id, 'held', 'expired', %(message_id)s, 1, %(worker)s FROM expired
"""

DUE = """
SELECT id::text, 'expire:' || id::text || ':'
       || round(extract(epoch FROM hold_until) * 1000)::text
  FROM reservations WHERE status = 'held' AND hold_until <= now() ORDER BY hold_until, id
"""

broker = RabbitmqBroker(  # type: ignore[no-untyped-call]  # Dramatiq has no annotations here
    url=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
)
dramatiq.set_broker(broker)
_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"])
        _local.conn = conn
    return conn


@dramatiq.actor(queue_name=QUEUE, max_retries=3)
def expire(reservation_id: str, message_id: str) -> None:
    """The guarded update and its audit row, one transaction; acked after it commits."""
    conn = _connection()
    with conn.transaction():
        conn.execute(EXPIRE, {"id": reservation_id, "message_id": message_id, "worker": WORKER})


def enqueue() -> int:
    """One message per due held reservation; how many."""
    broker.confirm_delivery = True
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        rows = conn.execute(DUE).fetchall()
    for reservation_id, message_id in rows:
        expire.send(str(reservation_id), str(message_id))
    broker.close()  # type: ignore[no-untyped-call]
    return len(rows)


if __name__ == "__main__":
    if sys.argv[1:] != ["enqueue"]:
        sys.exit("usage: python -m bench.peer enqueue")
    print(f"peer: enqueued {enqueue()} message(s)")
