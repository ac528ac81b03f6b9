"""The outbox's relay (``python -m service.relay``): publishes the ``reservation.expired``
events the expiries wrote (``expiry_events``, in their own transactions) to the exchange
``expiry.events``, with publisher confirms, and marks each sent after its confirm.

``running.py`` is the process (connections, checks, endpoint, a clean stop); ``pump.py``
claims, publishes, marks and gives back; ``ledger.py`` counts what it did and says what
went wrong; ``listener.py`` wakes it on NOTIFY and notices a listening connection that
died silently; ``exit_points.py`` has the test-only crash.
Several relays run at once safely: a claim is ``SKIP LOCKED`` with a lease, and only the
lease's holder marks what it sent (docs/events.md has the guarantees).
"""

from service.relay.pump import Pump
from service.relay.running import run

__all__ = ["Pump", "run"]
