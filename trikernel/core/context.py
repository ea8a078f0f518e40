"""The bracket of one request: ``status: busy``, the reply, ``status: idle``.

Messaging spec "Kernel status": every message on shell or control is
bracketed by busy and idle with it as parent, and the reply leaves before
idle. :class:`RequestContext` is the one place that sends those three
messages: each at most once, in that order, whoever sends it.

Who sends the reply. A sequential request's reply leaves from the thread
that ran its job, right when the job returns (:meth:`reply_from_thread`,
called by :class:`~trikernel.core.job.Job`), and idle is queued right
behind it, so the io run need not wake up before the reply can leave (issue
12: 65-230 us saved per request). The socket is still the server's alone:
the context hands the reply to :meth:`Transport.send
<trikernel.core.interfaces.Transport.send>`, the server's one entry for
replies, which any thread may call for the shell channel. Everything else
(a failed execute, whose stop_on_error window must open before its reply
leaves; a job that raised; ``--message-log``; a send that raised) is sent by
the io run through :meth:`reply` and :meth:`idle`, which skip what the
thread already sent.

Runs on: the io run, except :meth:`reply_from_thread`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.core.interfaces import Transport
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Message

    #: What :meth:`RequestContext.reply_early` was given: (metadata, when).
    _EarlyReply = tuple[Callable[[dict[str, Any]], dict[str, Any]] | None, Callable[[dict[str, Any]], bool] | None]

log = logging.getLogger("trikernel.dispatch")

#: Seconds the bracket waits at most to queue idle when cancelled
#: (shutdown); the IOPub queue has an overdraft for the io run, so this only
#: bounds a broken queue.
STATUS_DEADLINE = 1.0


class Reply(NamedTuple):
    """What a handler returns: the reply's ``content`` and ``metadata``;
    ``after``, called once idle is queued (shutdown starts there);
    ``on_sent``, called (io run) right after the reply left, with the wall
    time taken right before its send (a failed execute's stop_on_error
    window ends its first part there)."""

    content: dict[str, Any]
    metadata: dict[str, Any] | None = None
    after: Callable[[], None] | None = None
    on_sent: Callable[[float], None] | None = None


class RequestContext:
    """busy → reply → idle of one message on shell or control.

    Args:
        transport: where the three messages go.
        builder: builds them (the kernel's session).
        channel: "shell" or "control", where the reply goes.
        msg: the request (parent of all three).

    :attr:`replied` and :attr:`idle_sent` say what has left; each is set
    right after its send, so an interrupt landing in between cannot make the
    io run send it twice.
    """

    __slots__ = ("_builder", "_early", "_transport", "channel", "idle_sent", "msg", "replied")

    def __init__(self, transport: Transport, builder: MessageBuilder, channel: str, msg: Message):
        self._transport = transport
        self._builder = builder
        self._early: _EarlyReply | None = None  # set by reply_early: (metadata, when)
        self.channel = channel
        self.msg = msg
        self.replied = self.idle_sent = False

    async def busy(self) -> None:
        """Publish ``status: busy`` (io run; waits only past the io overdraft)."""
        await self._transport.publish(self._builder.status("busy", self.msg.header))

    def reply_early(
        self,
        metadata: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> bool:
        """Let the job's thread send the reply as soon as the job returns
        (module docstring), unless the transport records in the io run.

        Args:
            metadata: the reply's metadata from its content.
            when: False for content whose reply the io run must send (a
                failed execute).

        Returns:
            Whether the reply may leave from the thread. Runs on: the io run,
            before the job is handed over.
        """
        if not self._transport.replies_from_threads:
            return False
        self._early = (metadata, when)
        return True

    def reply_from_thread(self, content: Any) -> bool:
        """The job returned ``content``: send the reply now and queue idle
        behind it, if :meth:`reply_early` allowed it and ``when`` agrees.
        Idle is left to the io run when the IOPub queue has neither credit
        nor overdraft (it then waits for one).

        Returns:
            Whether the reply left (or was undeliverable: counted, logged);
            False leaves it to the io run.

        Runs on: the thread that ran the request's job, before the io run is
        told the job is done.
        """
        early = self._early
        if early is None or not isinstance(content, dict):
            return False
        metadata, when = early
        if when is not None and not when(content):
            return False
        reply = self._builder.reply(self.msg, content, metadata=metadata(content) if metadata else None)
        self._transport.send(self.channel, reply)  # or undeliverable: counted, logged
        self.replied = True
        try:
            idle = self._transport.publish_status_nowait(self._builder.status("idle", self.msg.header))
        except Exception:  # a bug: the reply is out, so the io run publishes idle
            log.exception("idle could not be queued from the user run")
            idle = False
        if idle:
            self.idle_sent = True
        return True

    def reply(
        self,
        content: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        on_sent: Callable[[float], None] | None = None,
    ) -> None:
        """Send the reply unless it has left already (io run; never blocks);
        ``on_sent``: called in the io run once it has left (Transport.send)."""
        if self.replied:
            return
        self._transport.send(self.channel, self._builder.reply(self.msg, content, metadata=metadata), on_sent)
        self.replied = True

    async def idle(self) -> None:
        """Publish ``status: idle`` unless it was queued already; shielded,
        bounded by STATUS_DEADLINE (io run).

        Cancellation: runs to the end (or the deadline) even when the caller
        is cancelled, so a request cut short at shutdown still ends idle.
        """
        if self.idle_sent:
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + STATUS_DEADLINE
            await self._transport.publish(self._builder.status("idle", self.msg.header))
            self.idle_sent = True
