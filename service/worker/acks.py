"""Acks coalesced into multiple-acks, never covering a delivery not yet settled.

A consumer channel numbers its deliveries 1, 2, 3, ... (AMQP delivery tags).
``basic.ack(tag, multiple=True)`` settles every outstanding delivery up to
``tag`` in one frame; on a busy queue one frame per delivery is the main cost
of consuming. ``Acker`` keeps, per channel, the highest tag below which every
delivery is settled (``floor``), the deliveries ready to be acked, and those
already settled some other way (a retry or dead-letter copy acked alone, a
nack). When the run of settled tags above the floor grows, one multiple-ack
covers it; a delivery still being handled stops the run, so it can never be
acked by a neighbour. Ready deliveries stuck behind such a one are acked
alone after ``stuck_after`` seconds, so a slow delivery delays its
neighbours' acks by that much at most.

The bookkeeping (``AckWindow``) is pure; ``Acker`` sends the frames.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiormq.exceptions

from service.adapters.amqp.consuming import AmqpMessage

log = logging.getLogger("service.consume")

STUCK_AFTER_SECONDS = 0.05

# Told once whether a delivery's ack was sent (None) or why it could not be.
Done = Callable[[BaseException | None], None]


@dataclass
class AckWindow:
    """One channel's delivery tags: which are settled, which wait for an ack."""

    floor: int = 0  # every tag <= floor is settled
    ready: dict[int, Any] = field(default_factory=dict)  # tag -> who waits for its ack
    settled: set[int] = field(default_factory=set)  # settled alone, above the floor

    def take_prefix(self) -> tuple[int | None, list[Any]]:
        """Advance the floor over the contiguous settled-or-ready tags.

        Returns the tag for one multiple-ack (the highest ready tag passed,
        ``None`` when none was) and what waited for it, in tag order.
        """
        top: int | None = None
        waiting: list[Any] = []
        while True:
            tag = self.floor + 1
            if tag in self.ready:
                waiting.append(self.ready.pop(tag))
                top = tag
            elif tag in self.settled:
                self.settled.discard(tag)
            else:
                return top, waiting
            self.floor = tag

    def take_stuck(self) -> list[tuple[int, Any]]:
        """The ready tags the floor cannot reach yet; each becomes settled alone."""
        stuck = sorted(self.ready.items())
        self.ready.clear()
        self.settled.update(tag for tag, _ in stuck)
        return stuck

    def mark_settled(self, tag: int) -> None:
        """``tag`` was acked or nacked alone: the floor may pass it."""
        if tag > self.floor:
            self.settled.add(tag)


class _Channel:
    """An ``AckWindow``, the channel its tags belong to, and the task that sends its acks."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.window = AckWindow()
        self.changed = asyncio.Event()
        self.flushing: asyncio.Task[None] | None = None


class Acker:
    """Acks deliveries after their commit, coalesced per channel."""

    def __init__(self, *, stuck_after: float = STUCK_AFTER_SECONDS) -> None:
        self.stuck_after = stuck_after
        self._channels: dict[int, _Channel] = {}

    async def ack(self, message: AmqpMessage) -> None:
        """Ack ``message`` (with its contiguous neighbours); returns once the frame is sent.

        Raises ``ChannelInvalidStateError`` when its channel is gone (its tag is
        void; the broker redelivers it), like ``message.ack()``.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ack_soon(message, lambda exc: _settle_future(future, exc))
        await future

    def ack_soon(self, message: AmqpMessage, done: Done) -> None:
        """Ack ``message`` with its neighbours; ``done(None)`` once the frame is sent.

        ``done(exc)`` instead when it cannot be (its channel is gone: the broker
        redelivers it). ``done`` is called once, from the event loop.
        """
        try:
            state = self._state(message)
        except aiormq.exceptions.ChannelInvalidStateError as exc:
            done(exc)
            return
        state.window.ready[message.delivery_tag or 0] = done
        self._wake(state)

    def settled(self, message: AmqpMessage) -> None:
        """``message`` was settled alone (a retry, a dead letter, a nack)."""
        try:
            state = self._state(message)
        except aiormq.exceptions.ChannelInvalidStateError:
            return
        state.window.mark_settled(message.delivery_tag or 0)
        self._wake(state)

    def _state(self, message: AmqpMessage) -> _Channel:
        channel = message.channel  # raises ChannelInvalidStateError once it is closed
        state = self._channels.get(id(channel))
        if state is None or state.channel is not channel:
            for key, old in list(self._channels.items()):
                if old.channel.is_closed:
                    _fail(old, aiormq.exceptions.ChannelInvalidStateError("channel closed"))
                    del self._channels[key]
            state = self._channels[id(channel)] = _Channel(channel)
        return state

    def _wake(self, state: _Channel) -> None:
        state.changed.set()
        if state.flushing is None or state.flushing.done():
            state.flushing = asyncio.create_task(self._flush(state))

    async def _flush(self, state: _Channel) -> None:
        """Send multiple-acks while the floor can rise; ack stuck ones alone in time."""
        loop = asyncio.get_running_loop()
        stuck_since: float | None = None
        while True:
            state.changed.clear()
            top, waiting = state.window.take_prefix()
            if top is not None:
                if not await _send(state, top, waiting, multiple=len(waiting) > 1):
                    return
                continue
            if not state.window.ready:
                return
            # Ready acks wait behind a delivery still being handled.
            now = loop.time()
            stuck_since = now if stuck_since is None else stuck_since
            try:
                async with asyncio.timeout(stuck_since + self.stuck_after - now):
                    await state.changed.wait()
            except TimeoutError:
                stuck = state.window.take_stuck()
                for index, (tag, done) in enumerate(stuck):
                    if not await _send(state, tag, [done], multiple=False, then=stuck[index + 1 :]):
                        return
                stuck_since = None


async def _send(
    state: _Channel,
    tag: int,
    waiting: list[Done],
    *,
    multiple: bool,
    then: Sequence[tuple[int, Done]] = (),
) -> bool:
    """One ack frame for ``waiting``; on failure ``waiting``, ``then`` and the rest fail."""
    try:
        await state.channel.basic_ack(delivery_tag=tag, multiple=multiple)
    except Exception as exc:
        _resolve([*waiting, *(done for _, done in then)], exc)
        _fail(state, exc)
        return False
    _resolve(waiting, None)
    return True


def _fail(state: _Channel, exc: BaseException) -> None:
    """The channel is gone: nothing it held can be acked any more."""
    waiting = list(state.window.ready.values())
    state.window.ready.clear()
    _resolve(waiting, exc)


def _resolve(waiting: list[Done], exc: BaseException | None) -> None:
    for done in waiting:
        try:
            done(exc)
        except Exception:  # one delivery's report must not keep the others from theirs
            log.exception("expiry.ack_report_failed")


def _settle_future(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


class Acks(Protocol):
    """How the consumer acks: coalesced (``Acker``) or one at a time (``AckAlone``)."""

    def ack_soon(self, message: AmqpMessage, done: Done) -> None:
        """Ack ``message``; ``done(None)`` once sent, ``done(exc)`` if it cannot be."""

    def settled(self, message: AmqpMessage) -> None:
        """``message`` was settled some other way (a copy acked alone, a reject)."""


class AckAlone:
    """One ack frame per delivery (batch size 1: the per-message path)."""

    def ack_soon(self, message: AmqpMessage, done: Done) -> None:
        """Send this delivery's own ack; ``done`` once it is sent, or with why not."""
        task = asyncio.create_task(message.ack())
        task.add_done_callback(lambda sent: _resolve([done], _failure_of(sent)))

    def settled(self, message: AmqpMessage) -> None:
        """Nothing to keep track of."""


def _failure_of(task: asyncio.Task[None]) -> BaseException | None:
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()
