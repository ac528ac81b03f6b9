"""A page's frames, built as bytes: exactly what pamqp marshals, and what it reads back;
and which channels take pages at all (aiormq's confirm channel, on a checked release)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import aiormq
import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from service.adapters.amqp import internals
from service.adapters.amqp.page_publisher import (
    Command,
    body_frame,
    command_frames,
    header_frame,
    properties_of,
    publish_frame,
    supports_pages,
)
from service.core.domain import command_body, message_id


def command(hold_until: datetime) -> Command:
    rid = uuid.uuid4()
    return Command(command_body(rid, hold_until), message_id(rid, hold_until))


COMMANDS = [
    command(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
    command(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
    command(datetime(1970, 1, 1, tzinfo=UTC)),  # a short message id (millis 0)
    command(datetime(2026, 6, 1, tzinfo=UTC).astimezone(UTC) + timedelta(hours=2)),
    Command(b"{}", "m" * 255),  # the longest short string
    Command(b"x" * 70_000, "\u00e9t\u00e9"),  # text that is not ASCII, a large body
]


@pytest.mark.parametrize("channel_number", [1, 7, 65535])
@pytest.mark.parametrize("cmd", COMMANDS, ids=range(len(COMMANDS)))
def test_the_header_frame_is_what_pamqp_marshals(cmd: Command, channel_number: int) -> None:
    """The template gives pamqp's bytes for the command's properties."""
    expected = pamqp_frame.marshal(
        ContentHeader(body_size=len(cmd.body), properties=properties_of(cmd.message_id)),
        channel_number,
    )
    assert header_frame(channel_number, cmd) == expected
    assert body_frame(channel_number, cmd.body) == pamqp_frame.marshal(
        ContentBody(cmd.body), channel_number
    )


@pytest.mark.parametrize("message_type", ["reservation.expired", "t" * 255, "\u00e9v\u00e9nement"])
@pytest.mark.parametrize("cmd", COMMANDS[:3], ids=range(3))
def test_the_header_frame_of_another_type_is_what_pamqp_marshals(
    cmd: Command, message_type: str
) -> None:
    """An event's header (its type ``reservation.expired``) is pamqp's bytes too."""
    properties = properties_of(cmd.message_id, None, message_type)
    expected = pamqp_frame.marshal(ContentHeader(body_size=len(cmd.body), properties=properties), 5)
    assert header_frame(5, cmd, message_type) == expected


def test_a_message_id_too_long_for_a_short_string_is_left_to_pamqp() -> None:
    """Over 255 bytes the template is not used: pamqp decides (it refuses)."""
    with pytest.raises(TypeError, match="exceeds maximum length"):
        header_frame(1, Command(b"{}", "m" * 256))


@pytest.mark.parametrize(
    "headers", [None, {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}]
)
def test_the_frames_read_back_as_the_command(headers: dict[str, str] | None) -> None:
    """pamqp reads the three frames back: the mandatory publish, the properties (with the
    trace headers when there are some), the body."""
    cmd = COMMANDS[0]
    data = command_frames(3, publish_frame(3, "expirations", "expire"), cmd, headers)
    read = []
    while data:
        consumed, channel, value = pamqp_frame.unmarshal(data)
        assert channel == 3
        read.append(value)
        data = data[consumed:]
    method, header, body = read
    assert isinstance(method, spec.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory) == (
        "expirations",
        "expire",
        True,
    )
    assert isinstance(header, ContentHeader)
    assert header.body_size == len(cmd.body)
    props = header.properties
    assert (props.content_type, props.delivery_mode) == ("application/json", 2)
    assert (props.message_id, props.message_type, props.app_id) == (
        cmd.message_id,
        "expire",
        "expiry-service",
    )
    assert props.headers == headers
    assert isinstance(body, ContentBody)
    assert body.value == cmd.body


def unopened_connection() -> aiormq.Connection:
    """An aiormq connection never opened, told what a broker's tune and capabilities
    would tell it."""
    connection = aiormq.Connection("amqp://guest:guest@127.0.0.1:9/")
    connection.connection_tune = spec.Connection.Tune(frame_max=131072)
    connection.server_properties = {"capabilities": {"publisher_confirms": True}}
    return connection


@pytest.fixture
async def confirm_channel() -> AsyncIterator[aiormq.Channel]:
    """aiormq's own channel class with confirms, made without a broker."""
    connection = unopened_connection()
    try:
        yield aiormq.Channel(connection, 1, publisher_confirms=True)
    finally:
        await connection.close()  # ends the channel's reader task


async def test_a_confirm_channel_of_a_checked_aiormq_takes_pages(
    confirm_channel: aiormq.Channel,
) -> None:
    """With the aiormq installed here (a checked release), aiormq's confirm channel takes
    pages: the path the scan takes."""
    assert internals.AIORMQ.admits(internals.installed("aiormq"))
    assert supports_pages(confirm_channel)


@pytest.mark.parametrize("release", ["7.2.3", "7.3.0", "8.0.0", "7.2.5rc1", "7.2.4+local", None])
async def test_an_aiormq_outside_the_checked_releases_publishes_one_by_one(
    confirm_channel: aiormq.Channel, monkeypatch: pytest.MonkeyPatch, release: str | None
) -> None:
    """Another aiormq release (or none found) takes no pages, whatever its channel has."""
    monkeypatch.setattr(internals, "installed", lambda _name: release)
    assert not supports_pages(confirm_channel)


async def test_a_later_patch_release_within_the_range_takes_pages(
    confirm_channel: aiormq.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A patch release within the declared range is the range's (CI checks the newest)."""
    monkeypatch.setattr(internals, "installed", lambda _name: "7.2.99")
    assert supports_pages(confirm_channel)


@pytest.mark.parametrize(
    "attribute",
    [
        "publisher_confirms",
        "delivery_tag",
        "confirmations",
        "message_id_delivery_tag",
        "write_queue",
        "max_content_size",
        "number",
    ],
)
async def test_a_channel_missing_what_basic_publish_uses_publishes_one_by_one(
    confirm_channel: aiormq.Channel, attribute: str
) -> None:
    """A channel of a checked release without one of the attributes a page uses (renamed
    in some build) takes no pages."""
    delattr(confirm_channel, attribute)
    assert not supports_pages(confirm_channel)


async def test_anything_but_aiormqs_confirm_channel_publishes_one_by_one() -> None:
    """A channel without confirms, a look-alike of another class, anything else: no pages."""
    connection = unopened_connection()
    try:
        assert not supports_pages(aiormq.Channel(connection, 1, publisher_confirms=False))
    finally:
        await connection.close()

    look_alike = SimpleNamespace(
        publisher_confirms=True,
        delivery_tag=0,
        confirmations={},
        message_id_delivery_tag={},
        write_queue=asyncio.Queue[object](),
        max_content_size=131064,
        number=1,
        lock=asyncio.Lock(),
    )
    assert not supports_pages(look_alike)
    assert not supports_pages(object())
