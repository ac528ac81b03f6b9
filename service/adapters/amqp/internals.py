"""Where the service relies on what its libraries do not document, and the releases
each of those touchpoints was checked on.

A release can change any of these without notice. The ranges in ``CHECKED`` are the
ones ``pyproject.toml`` declares. The page publisher and the total decoders are used
only within theirs (``AIORMQ``, ``PAMQP``); outside, the public path is taken, and
``install()`` names every library outside its range in one warning line at a
command's start. ``.ci/run`` installs the newest releases the ranges allow and runs
the page and hostile-frame tests on them.

aiormq: checked on 7.2.4, used on >=7.2.4,<7.3 (``AIORMQ``). The page publisher
(``page_publisher.py``) writes a page of commands as aiormq's ``Channel.basic_publish`` writes
one, on the ``aiormq.Channel`` that aio-pika's ``get_underlay_channel()`` returns. Of
that channel it uses, beyond ``aiormq.abc.AbstractChannel``:

- ``publisher_confirms``, ``max_content_size``: read, to know that the page may go;
- ``lock``: held while the page takes its delivery tags and is queued;
- ``delivery_tag``: the last tag taken, advanced by the page's length (put back if the
  page was never queued);
- ``confirmations``: a future per tag, which aiormq's reader resolves on the broker's
  ack, nack or return (``_on_confirm_frame``, ``_on_return_frame``);
- ``message_id_delivery_tag``: message id -> tag, how a return finds its command;
  the page's entries are removed once it is done;
- ``create_future()``: futures that fail when the channel closes;
- ``write_queue`` (the connection's): one ``aiormq.abc.ChannelFrame`` with the page's
  bytes, whose ``drain_future`` the writer completes once they are sent.

Off: each command goes through ``basic_publish`` (same outcomes, slower).
(``consuming.py`` uses that channel too, but only what ``aiormq.abc.AbstractChannel``
declares: ``basic_consume``, ``basic_ack``, ``basic_reject``, ``basic_cancel``,
``on_consumer_cancel_callbacks``, ``closing``.)

pamqp: checked on 4.0.1, used on >=4.0.1,<4.1 (``PAMQP``). The total decoders
(``wire.py``) replace, in ``pamqp.decode``, the functions ``short_str``, ``timestamp``
and ``field_table``, their entries in ``METHODS`` (``shortstr``, ``timestamp``,
``table``) and in ``TABLE_MAPPING`` (``T``, ``F``); ``wire.field_table`` repeats
pamqp 4's table loop with ``decode.embedded_value`` and ``common.Struct``. Off:
pamqp's own decoders, with which a non-UTF-8 short string or header name, or a
timestamp past the year 9999, closes the consumer's connection (as with aio-pika
alone).

aio-pika: checked on 10.2.1, declared >=10.2.1,<10.3 (``AIO_PIKA``).
``ClusterConnection`` (``connection.py``) subclasses ``RobustConnection``, writes its
``url`` to move to the next node (aio-pika reads it at each connect and reconnect) and
reads ``reconnect_interval``; the move is made by a close callback, which aio-pika
runs before it reconnects. Nothing is switched off outside the range: where aio-pika
no longer reads ``url`` the connection reconnects to its own node, as aio-pika does
alone.

Elsewhere, each checked where it is:

- uvicorn 0.54.0, h11 0.16.0: ``service/console/protocol.py`` subclasses
  ``H11Protocol`` (overrides ``send_400_response`` and ``data_received``, calls
  ``_unset_keepalive_if_required``, uses ``conn``, ``flow``, ``transport``, ``loop``);
  its ``CHECKED_ON`` and ``http_protocol()`` fall back to uvicorn's ``"h11"``.
- uvicorn: ``service/console/__main__.py`` overrides ``Server.capture_signals``.
- Starlette: ``service/console/app.py`` overrides ``Starlette.build_middleware_stack``.
- opentelemetry-instrumentation-aio-pika 0.66b1 (pinned): ``service/adapters/telemetry/``
  unwraps ``aio_pika.Queue.consume``, knowing the instrumentor wraps it there.
- asyncpg: ``service/adapters/classify.py`` reads ``asyncpg.exceptions._base.DataError``
  (the client-side encoding error, not exported).
- logging: ``service/adapters/telemetry/`` sets ``logging._srcfile = None`` (the
  logging HOWTO's own advice).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from importlib import metadata

from service.adapters.amqp import wire

log = logging.getLogger(__name__)

_PLAIN_RELEASE = re.compile(r"\d+(\.\d+)*")


def release(version: str) -> tuple[int, ...] | None:
    """``7.2.4`` as ``(7, 2, 4)``; None for anything but a plain release (a pre-release,
    a post-release, a local version: none of them was checked)."""
    if _PLAIN_RELEASE.fullmatch(version) is None:
        return None
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Checked:
    """A library's releases a touchpoint is used on: from ``lowest`` (the one it was
    checked on) up to, not including, ``below``."""

    distribution: str
    lowest: str
    below: str

    def __post_init__(self) -> None:
        if release(self.lowest) is None or release(self.below) is None:
            raise ValueError(f"{self.distribution}: the bounds must be plain releases")

    @property
    def requirement(self) -> str:
        """The range as ``pyproject.toml`` declares it."""
        return f"{self.distribution}>={self.lowest},<{self.below}"

    def admits(self, version: str | None) -> bool:
        """Whether ``version`` (None: not installed) is within the range."""
        found = None if version is None else release(version)
        lowest, below = release(self.lowest) or (), release(self.below) or ()
        return found is not None and lowest <= found < below


AIO_PIKA = Checked("aio-pika", "10.2.1", "10.3")
AIORMQ = Checked("aiormq", "7.2.4", "7.3")
PAMQP = Checked("pamqp", "4.0.1", "4.1")
CHECKED = (AIO_PIKA, AIORMQ, PAMQP)
# What a release outside its range costs, for the warning line.
OFF = {
    AIO_PIKA.distribution: "node failover used unchecked",
    AIORMQ.distribution: "pages published one by one",
    PAMQP.distribution: "pamqp's own decoders (a hostile frame closes the connection)",
}


@functools.cache
def installed(distribution: str) -> str | None:
    """The installed release of ``distribution``, None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def pages_allowed() -> bool:
    """Whether the installed aiormq is one the page publisher was checked on."""
    return AIORMQ.admits(installed(AIORMQ.distribution))


def decoders_allowed() -> bool:
    """Whether the installed pamqp is one the total decoders were checked on."""
    return PAMQP.admits(installed(PAMQP.distribution))


def unchecked() -> list[Checked]:
    """The libraries whose installed release is outside its checked range."""
    return [each for each in CHECKED if not each.admits(installed(each.distribution))]


def install() -> None:
    """At a process's start (``service.cli.run_command``): the total decoders where the
    installed pamqp allows them, and one warning line naming every library outside its
    checked range and what that turns off. The page publisher asks ``pages_allowed()``
    itself."""
    if decoders_allowed():
        wire.install()
    outside = unchecked()
    if outside:
        log.warning(
            "amqp.unchecked_release",
            extra={
                "installed": ", ".join(
                    f"{each.distribution} {installed(each.distribution) or 'missing'}"
                    for each in outside
                ),
                "checked": ", ".join(each.requirement for each in outside),
                "effect": "; ".join(OFF[each.distribution] for each in outside),
            },
        )
