"""AMQP frames that no publisher can turn into a dead connection.

aio-pika reads frames with pamqp, which raises on three things RabbitMQ
passes on untouched from any publisher: a short string (``message_id``,
``type``, ``app_id``, ...) that is not UTF-8, a header name that is not UTF-8,
and a timestamp past the year 9999 (a Java client's ``new Date(Long.MAX_VALUE)``).
aiormq turns that exception into a dead connection, so one such message, sent
by anyone with write access, would close every consumer that receives it,
again at each redelivery, returning everything they held each time.

``install()`` makes those three decoders total: text that is not UTF-8 is
decoded with replacement characters, and a timestamp beyond what ``datetime``
holds becomes ``datetime.max`` (UTC). Every other frame decodes exactly as
before; the decoders are pamqp's own, tried first. Idempotent.

It replaces module attributes of ``pamqp.decode`` for the whole process, so it
is called once, at a command's start, by ``internals.install()`` (from
``service.cli.run_command``), and only on the pamqp releases it was checked on;
importing this module changes nothing.
"""

from __future__ import annotations

import datetime
import struct

from pamqp import common, decode

_SHORT_STR = decode.short_str
_TIMESTAMP = decode.timestamp
_FIELD_TABLE = decode.field_table
FAR_FUTURE = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def short_str(value: bytes) -> tuple[int, str]:
    """pamqp's short string decoder, with undecodable bytes replaced."""
    try:
        return _SHORT_STR(value)
    except UnicodeDecodeError:
        length = value[0]
        return length + 1, value[1 : length + 1].decode("utf-8", "replace")


def timestamp(value: bytes) -> tuple[int, datetime.datetime]:
    """pamqp's timestamp decoder, with a time past ``datetime.max`` read as that."""
    try:
        return _TIMESTAMP(value)
    except (ValueError, OverflowError, OSError):
        if len(value) < 8:
            raise  # a truncated frame stays an error
        return 8, FAR_FUTURE


def field_table(value: bytes) -> tuple[int, common.FieldTable]:
    """pamqp's table decoder, with header names that are not UTF-8 decoded with
    replacement characters (the same loop as pamqp 4's ``field_table``)."""
    try:
        return _FIELD_TABLE(value)
    except UnicodeDecodeError:
        pass
    try:
        length = common.Struct.integer.unpack(value[0:4])[0]
        offset, end = 4, 4 + length
        if end > len(value):
            raise ValueError("Field table length exceeds available data")
        data: common.FieldTable = {}
        while offset < end:
            key_length = common.Struct.byte.unpack_from(value, offset)[0]
            offset += 1
            if offset + key_length > end:
                raise ValueError("Field table key length exceeds data")
            key = value[offset : offset + key_length].decode("utf-8", "replace")
            offset += key_length
            consumed, result = decode.embedded_value(value[offset:])
            offset += consumed
            data[key] = result
    except (struct.error, TypeError) as err:
        raise ValueError("Could not unpack data") from err
    return end, data


def install() -> None:
    """Use the total decoders for every frame this process reads (``internals.install()``
    decides whether the installed pamqp allows it)."""
    decode.short_str = short_str
    decode.timestamp = timestamp
    decode.field_table = field_table
    decode.METHODS["shortstr"] = short_str
    decode.METHODS["timestamp"] = timestamp
    decode.METHODS["table"] = field_table
    decode.TABLE_MAPPING[b"T"] = timestamp
    decode.TABLE_MAPPING[b"F"] = field_table
