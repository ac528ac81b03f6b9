"""Vhosts of their own for a run: made through the management API, the AMQP URL's user
allowed everything in them, then deleted (the demo's, the benchmark's and the tests' own
work, beside a database of their own)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from service.adapters.amqp.management import Management, ManagementUnavailable


def with_vhost(amqp_url: str, vhost: str) -> str:
    """``amqp_url`` pointing at ``vhost``."""
    return urlunsplit(urlsplit(amqp_url)._replace(path=f"/{quote(vhost, safe='')}"))


def amqp_user(amqp_url: str) -> str:
    """The user an AMQP URL logs in as (guest when it names none)."""
    return unquote(urlsplit(amqp_url).username or "guest")


@contextlib.asynccontextmanager
async def vhost_created(
    management: Management, name: str, *, user: str, keep: bool = False, lenient: bool = False
) -> AsyncIterator[None]:
    """Vhost ``name``, where ``user`` may do anything, for the block; deleted afterwards
    unless ``keep`` (``lenient``: one that cannot be deleted, its node down, is left)."""
    await management.create_vhost(name, user)
    try:
        yield
    finally:
        if not keep:
            try:
                await management.delete_vhost(name)
            except ManagementUnavailable:
                if not lenient:
                    raise
