"""A page's frames, built as bytes: exactly what pamqp marshals, and what it reads back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from service.adapters.amqp.pages import (
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


def test_only_a_confirm_channel_with_what_basic_publish_uses_takes_pages() -> None:
    """Anything else (another aiormq, a channel without confirms) publishes one by one."""

    class Bare:
        pass

    assert not supports_pages(Bare())
    assert not supports_pages(object())
