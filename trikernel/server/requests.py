"""The shell and control channels: read, parse, hand to the core; send its replies.

:class:`RequestServer` is the server's half of the core/transport seam
(core/interfaces.py ``Transport``): one channel task per ROUTER (the
socket's reader) parses every message (inbound.py) and hands it to
:meth:`KernelCore.receive <trikernel.core.kernelcore.KernelCore.receive>`;
every reply the core sends goes through :meth:`RequestServer.send`, the one
code path that writes to these sockets.

Who may write. A sequential shell request's reply is sent from the thread
that ran the request (core/context.py, "Who sends the reply"), the main
thread or a subshell's, so that the io run need not wake before it leaves.
The ROUTER still has one owner, this server: :class:`TrioSocket
<trikernel.server.sockets.TrioSocket>` makes every libzmq call on it under
one lock (the full memory barrier zmq(7) asks of a socket used from more
than one thread), and a send from another thread that consumed the
``ZMQ_FD`` edge over a queued request wakes the io run's reader through
its token. Control replies, and everything with ``--message-log`` (which
records in the io run), are sent by the io run.

Runs on: the io run (the channel tasks, :meth:`RequestServer.receive_nowait`,
:meth:`RequestServer.publish`); :meth:`RequestServer.send` also the thread
that ran a shell request; :meth:`RequestServer.publish_status_nowait` any
thread but the io thread.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import TYPE_CHECKING

import trio

from trikernel.core.interfaces import EMPTY, Empty
from trikernel.protocol.wire import serialize

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.core.kernelcore import KernelCore
    from trikernel.protocol.wire import Message, Received
    from trikernel.server.inbound import InboundParser
    from trikernel.server.iopubqueue import IOPubQueue
    from trikernel.server.sockets import TrioSocket
    from trikernel.server.switchinterval import SwitchIntervals

log = logging.getLogger("trikernel.dispatch")


class RequestServer:
    """Serves the shell and control ROUTERs for a :class:`KernelCore`.

    Args:
        sockets: ``{"shell": TrioSocket, "control": TrioSocket}``.
        parse: the connection's InboundParser (inbound.py): frames →
            Message, or None for bad input (it counts and logs what it
            drops). Replies are signed with its ``signer`` and recorded in
            its ``message_log`` (``--message-log``, or None), the ones the
            requests were verified and recorded with, as the stdin bridge does.
        queue: the IOPub queue (status messages of the brackets).
        switch: shortens the thread switch interval while a control request
            is received and answered (switchinterval.py), or None.

    Call :meth:`attach` with the core before the io run serves.
    """

    def __init__(
        self,
        sockets: dict[str, TrioSocket],
        parse: InboundParser,
        queue: IOPubQueue,
        *,
        switch: SwitchIntervals | None = None,
    ):
        self._sockets = sockets
        self._parse = parse
        self._signer = parse.signer
        self._queue = queue
        self._message_log = parse.message_log
        self._switch = switch
        self._core: KernelCore | None = None
        self._io_ident: int | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def attach(self, core: KernelCore) -> None:
        """The core the channels hand their messages to (before the io run starts)."""
        self._core = core

    async def serve(self, channel: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The channel task of ``channel`` ("shell" or "control"): read,
        parse and hand every message to the core, until cancelled.

        Cancellation: a cancelled receive loses no message (TrioSocket
        checkpoints before it takes one); a message handed over is the
        core's to answer.
        """
        assert self._core is not None, "attach() the core first"
        sock = self._sockets[channel]
        self._io_ident = threading.get_ident()
        self._token = trio.lowlevel.current_trio_token()
        switch = self._switch if channel == "control" else None
        if switch is not None:
            sock.on_wake = switch.shorten  # before the frames are received (switchinterval.py)
            sock.on_empty_wake = switch.restore
        task_status.started()
        while True:
            try:
                # no local keeps a message alive between two receives: a
                # dropped 64 MiB frame is freed at once, not at the next message
                await self._hand_over(channel, await sock.recv_multipart())
            finally:
                if switch is not None:
                    switch.restore()

    async def _hand_over(self, channel: str, frames: list[Received]) -> None:
        msg = self._parse(channel, frames)
        del frames
        if msg is None:
            return
        assert self._core is not None
        await self._core.receive(channel, msg)

    # -- core/interfaces.Transport ---------------------------------------------------
    @property
    def replies_from_threads(self) -> bool:
        """False with ``--message-log``: the log is recorded in the io run only."""
        return self._message_log is None

    def send(self, channel: str, msg: Message, on_sent: Callable[[float], None] | None = None) -> bool:
        """Sign and send a reply; False when the ROUTER cannot route it
        (counted and logged by TrioSocket). Never blocks.

        A shell reply leaves only after every IOPub message queued before it
        (the request's output) was handed to the XPUB: when some are still
        queued or in flight, the reply waits in the IOPub FIFO behind them
        (IOPubQueue.put_ordered) and the iopub task sends it (True is
        returned then: it is on its way; a failure is counted and logged
        there). Control replies leave at once: kernel_info and interrupt
        never wait behind a flood or a stalled subscriber. ``on_sent`` is
        called right after the send (from the sending thread), with the wall
        time (``time.time()``) taken right *before* it: the reply cannot have
        reached the client earlier.

        Runs on: the io run; for "shell" also the thread that ran the request.

        Raises:
            zmq.ZMQError: the socket is closed (a send from a user thread
                racing the end of shutdown; the Job logs it).
        """
        frames = serialize(msg, self._signer)
        if channel == "shell" and self._queue.put_ordered(
            functools.partial(self._send_queued, channel, frames, on_sent)
        ):
            return True
        sent_at = time.time()
        delivered = self._send_now(channel, frames)
        if on_sent is not None:
            on_sent(sent_at)
        return delivered

    def _send_now(self, channel: str, frames: list[bytes]) -> bool:
        sock = self._sockets[channel]
        if self._io_ident is not None and threading.get_ident() != self._io_ident:
            assert self._token is not None
            return sock.send_from_thread(frames, self._token)
        delivered = sock.send_nowait(frames)
        if self._message_log is not None:
            self._message_log.record("out", channel, frames, None if delivered else {"undelivered": True})
        return delivered

    def _send_queued(self, channel: str, frames: list[bytes], on_sent: Callable[[float], None] | None) -> None:
        """The iopub task reached a queued reply (io run): send it; never raises."""
        sent_at = time.time()
        try:
            self._send_now(channel, frames)
        except Exception:  # a socket closed at the very end of shutdown
            log.exception("%s: a reply could not be sent", channel)
        if on_sent is not None:
            try:
                on_sent(sent_at)
            except Exception:  # a bug: never take the iopub task down
                log.exception("%s: after a reply was sent", channel)

    async def publish(self, msg: Message) -> bool:
        """Queue an IOPub message from the io run (iopubqueue.IOPubQueue.put)."""
        return await self._queue.put(msg)

    def publish_status_nowait(self, msg: Message) -> bool:
        """Queue a status from a user thread without waiting (IOPubQueue.put_status_nowait)."""
        return self._queue.put_status_nowait(msg)

    def receive_nowait(self, channel: str) -> Message | Empty | None:
        """The next queued message on ``channel``, parsed (None: bad input,
        dropped); EMPTY when none is queued. No checkpoint; io run."""
        frames = self._sockets[channel].recv_multipart_nowait()
        if frames is None:
            return EMPTY
        return self._parse(channel, frames)
