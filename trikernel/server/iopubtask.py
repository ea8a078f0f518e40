"""The iopub task: the sole owner of the XPUB socket; it drains the IOPub queue into it.

docs/design.md, "The IOPub path". Every IOPub message (status, execute_input, stream,
display_data, execute_result, error, clear_output, comm_*) goes through ONE
:class:`IOPubQueue`. Its consumer is :meth:`IOPubTask.run`, the iopub
task in the io thread's trio run, the sole owner of the XPUB socket.

The queue (and why it is not a trio channel): iopubqueue.py.

Sending: non-blocking sends with XPUB_NODROP on. libzmq's XPUB signals
POLLOUT even when a subscriber pipe is full (NODROP only shows as EAGAIN on
send), so a full subscriber is waited for by retrying with backoff (0.5 ms
doubling to 5 ms) — bounded by ``send_timeout``. Past it the message is
sent once with NODROP off (only full subscribers lose it), the event is
counted and logged (warning, rate-limited), and the task enters *degraded*
mode: further EAGAINs fall back at once, until a NODROP send succeeds again
(the stuck subscriber drained or left). Every new subscriber gets an
``iopub_welcome`` (XPUB_VERBOSE on, JEP 65).

No subscriber: a PUB socket drops what it sends while nobody is subscribed,
and a client's SUB socket joins some time after the client connected its
other channels (libzmq connects in the background, and a connect made
before the kernel bound its port is retried only every ``ZMQ_RECONNECT_IVL``,
100 ms). A client that sends ``execute_request`` as soon as ``kernel_info``
was answered (jupyter console does) then lost busy, output and idle, and
waited for idle for ever (jupyter_client#593; 5 in 25 starts under load
with ipykernel 7). So until someone listens (subscribers.py:
``Subscribers.listening``, a subscription read from a live connection),
the iopub task *holds* what it would send, up to ``hold_bytes`` (oldest
dropped past it, or a single message larger than it alone, counted in
``hold_drops``), and sends it, in order, right after that subscriber's
welcome. The hold starts again when the XPUB has no connection left.

Subscriptions, welcomes and the connection count: subscribers.py.

Runs on: the io thread's trio run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import trio
import zmq

from trikernel.protocol.wire import serialize
from trikernel.server.iopubqueue import Ordered, StreamBatch, _Close
from trikernel.server.subscribers import Subscribers

if TYPE_CHECKING:
    from trikernel.core.badinput import BadInputLog
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.server.iopubqueue import IOPubQueue
    from trikernel.server.messagelog import MessageLog

log = logging.getLogger("trikernel.iopub")

#: Backoff bounds (seconds) while a NODROP send meets a full subscriber.
RETRY_MIN_DELAY = 0.0005
RETRY_MAX_DELAY = 0.005
#: Messages the iopub task takes from the queue at once (one lock round
#: trip, one credit return, one EVENTS check per batch).
SEND_BATCH = 64
#: Minimum seconds between two warnings of the same kind.
WARN_INTERVAL = 5.0
#: Minimum seconds between two ``stream`` messages of one stream while a
#: flood goes on (the batch stays open and collects text meanwhile).
STREAM_INTERVAL = 0.01
#: Seconds an open stream batch waits before it leaves, so ``print("x")``
#: (two writes: text, newline) becomes one message.
FIRST_WRITE_DELAY = 0.001
#: Seconds more an open stream batch that ends in the middle of a line waits
#: for the rest of the line (or any other message, which seals it): on a
#: loaded machine ``print``'s newline can come later than FIRST_WRITE_DELAY,
#: and a notebook would then keep two outputs, ``"x"`` and ``"\n"``, where
#: ipykernel's has one (nbclient's HelloWorld test). ipykernel flushes every
#: 0.2 s (``OutStream.flush_interval``) too. Text without a newline
#: (a prompt, a progress bar's ``\r``) leaves after this at the latest.
PARTIAL_LINE_HOLD = 0.2


_raw_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


def _send_frames(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """send_multipart(frames, NOBLOCK) with plain int flags.

    pyzmq's send_multipart combines enum flags per frame in Python and goes
    through the sugar layer, a measurable share of the iopub task's time. A multipart message is
    atomic in libzmq: EAGAIN can only come on the first frame, before
    anything was queued, so a retry resends the whole message.
    """
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _raw_send(sock, frame, _MORE_NOBLOCK if i < last else _NOBLOCK)


class _RateLimitedWarning:
    """Log a warning at most every WARN_INTERVAL seconds, counting the rest."""

    def __init__(self) -> None:
        self.last = -1e9
        self.suppressed = 0

    def __call__(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last >= WARN_INTERVAL:
            extra = f" ({self.suppressed} similar suppressed)" if self.suppressed else ""
            log.warning(msg + extra, *args)
            self.last = now
            self.suppressed = 0
        else:
            self.suppressed += 1


class IOPubTask:
    """The iopub task: drains the queue into the XPUB socket.

    Owns: the XPUB socket and its monitor. Reads: the queue; subscription
    frames and connection events through :attr:`subscribers`. Writes:
    messages, ``iopub_welcome``. Exits: after the close marker (queue
    drained) or on cancellation. ``message_log``: records each message
    after it left (``--message-log``), or None: one test per message.
    ``hold_bytes``: what is held while no one listens (module
    docstring; the kernel passes ``--iopub-hold-bytes``, 8 MiB by default);
    0 holds nothing: every message is sent, as by a plain PUB socket (lost
    by libzmq when nobody is subscribed). ``monitor``: the XPUB's monitor
    socket (sockets.BoundSockets.iopub_monitor), whose connection events
    start the hold again when the last connection is gone; read for as
    long as the task runs, also with ``hold_bytes`` 0 (an unread monitor
    stalls libzmq's I/O thread); None: the hold is for the first subscriber
    only. ``bad_input``, ``max_topic_bytes``: as :class:`~trikernel.server.subscribers.Subscribers`
    takes them.
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        queue: IOPubQueue,
        builder: MessageBuilder,
        *,
        send_timeout: float,
        warn_after: float,
        nodrop: bool = True,
        bad_input: BadInputLog | None = None,
        max_topic_bytes: int = 1024,
        message_log: MessageLog | None = None,
        hold_bytes: int = 0,
        monitor: zmq.Socket[Any] | None = None,
    ):
        self.sock = sock
        self.queue = queue
        self.builder = builder
        self.signer = queue.signer
        self.send_timeout = send_timeout
        self.warn_after = warn_after
        self.stats = queue.stats
        #: XPUB_NODROP as configured before bind (sockopts); if off, libzmq
        #: drops for full subscribers itself and no send ever waits.
        self.nodrop = nodrop
        self.degraded = False
        self._warn_wait = _RateLimitedWarning()
        self._warn_drop = _RateLimitedWarning()
        self._last_stream = 0.0
        self._sub_waiter: trio.CancelScope | None = None
        self.message_log = message_log
        #: subscriptions, welcomes and the connection count (subscribers.py)
        self.subscribers = Subscribers(
            sock,
            builder,
            self.signer,
            self.stats,
            bad_input=bad_input,
            max_topic_bytes=max_topic_bytes,
            monitor=monitor,
        )
        self.hold_bytes = hold_bytes
        self._held: deque[list[bytes]] = deque()
        self._held_bytes = 0
        #: one flush at a time (the run loop and the welcomer both flush)
        self._flushing = trio.Lock()
        self._warn_hold = _RateLimitedWarning()

    @property
    def holding(self) -> bool:
        """Whether messages are held now: no subscription frame read since the
        task started or since the last connection left (io run; a subscriber
        whose frame is not read yet does not count), or held ones still being
        sent. Read from any thread (a plain attribute read)."""
        return bool(self.hold_bytes) and (not self.subscribers.listening or bool(self._held))

    @property
    def connections(self) -> int:
        """The XPUB's connections now, from its monitor (subscribers.py); any thread."""
        return self.subscribers.connections

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The iopub task. Attaches the queue, welcomes subscribers already there
        (``iopub_welcome``, JEP 65), starts the subscription and connection watchers, then
        reports ``task_status`` started and sends what the queue gives, up to
        :data:`SEND_BATCH` messages at a time, in FIFO order (held while nobody listens),
        returning each credit after its send; an :class:`~trikernel.server.iopubqueue.Ordered`
        marker's send (a shell reply, an ``input_request``) runs when the loop reaches it,
        after everything ahead of it. Returns after the close marker, once the queue
        is drained; a message that cannot be sent is logged and counted in ``send_errors``,
        never raised. io run only."""
        self.queue.attach()
        async with trio.open_nursery() as nursery:
            # welcome subscribers that connected before we started, first
            subscribers = self.subscribers
            subscribers.read()
            await self._send_welcomes()
            nursery.start_soon(self._watch_subscriptions)
            if subscribers.monitor is not None:  # read also with hold_bytes 0: an unread monitor stalls libzmq
                subscribers.read_connection_events()
                nursery.start_soon(subscribers.watch_connections)
            task_status.started()
            closing = False
            mlog = self.message_log
            while not closing:
                batch = await self.queue.get(SEND_BATCH)
                held = 0  # items in the batch that hold a credit (all but the close marker)
                try:
                    for item in batch:
                        if isinstance(item, _Close):
                            closing = True
                            continue
                        if isinstance(item, Ordered):  # a reply or input_request: what was ahead has gone
                            item.send()
                            continue
                        held += 1
                        if log.isEnabledFor(logging.DEBUG):
                            log.debug("sending %s", item.name if isinstance(item, StreamBatch) else item[0])
                        try:
                            frames = await self._stream_frames(item) if isinstance(item, StreamBatch) else item[1]
                            # While a flush is under way _held is not empty (it pops a message
                            # only once sent), so a newer message never overtakes a held one.
                            if self.hold_bytes and (self._held or not subscribers.listening):
                                self._hold(frames)
                                await self._flush_held()
                            else:
                                await self._send(frames)
                                self.stats.sent += 1
                                if mlog is not None:
                                    mlog.record("out", "iopub", frames)
                        except Exception:  # trio.Cancelled is a BaseException: it passes
                            # never let one message take the IOPub path down
                            self.stats.send_errors += 1
                            log.exception(
                                "iopub: could not send a message; it is lost (send_errors=%d)", self.stats.send_errors
                            )
                finally:
                    self.queue.release(held)
                    self._after_sends()
                # A queue that never runs dry must not starve the control,
                # shell and stdin tasks of this run.
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        if self._held:
            self.stats.hold_drops += len(self._held)
            log.debug("iopub: %d held message(s) never had a subscriber", len(self._held))

    def _hold(self, frames: list[bytes]) -> None:
        """Keep ``frames`` for the next subscriber; drop the oldest past ``hold_bytes``.
        A message larger than ``hold_bytes`` by itself is dropped alone: it
        would not fit even with all older ones dropped for it."""
        size = sum(map(len, frames))
        self.stats.held += 1
        if size > self.hold_bytes:
            self.stats.hold_drops += 1
            self._warn_hold(
                "iopub: no subscriber, and a message of %d bytes is larger than the %d bytes held for the "
                "next one; it is dropped (hold_drops=%d)",
                size,
                self.hold_bytes,
                self.stats.hold_drops,
            )
            return
        self._held.append(frames)
        self._held_bytes += size
        while self._held_bytes > self.hold_bytes and self._held:
            self._held_bytes -= sum(map(len, self._held.popleft()))
            self.stats.hold_drops += 1
            self._warn_hold(
                "iopub: no subscriber, and more than %d bytes of messages held for the next one; "
                "the oldest are dropped (hold_drops=%d)",
                self.hold_bytes,
                self.stats.hold_drops,
            )

    async def _flush_held(self) -> None:
        """Send the held messages, oldest first, once someone has subscribed.
        Called by the run loop and by the welcomer (after a welcome); the lock
        keeps the order when both do."""
        async with self._flushing:
            while self._held and self.subscribers.listening:
                frames = self._held[0]
                try:
                    await self._send(frames)
                except Exception:  # as in run(): one message never takes the IOPub path down
                    self.stats.send_errors += 1
                    log.exception("iopub: could not send a held message; it is lost")
                else:
                    self.stats.sent += 1
                    if self.message_log is not None:
                        self.message_log.record("out", "iopub", frames)
                self._held.popleft()
                self._held_bytes -= sum(map(len, frames))

    async def _stream_frames(self, b: StreamBatch) -> list[bytes]:
        # While a flood goes on, let the open tail batch collect more text.
        if not b.sealed:
            # still the open tail of the queue: let it gather the rest of the
            # line (FIRST_WRITE_DELAY), or of a flood (STREAM_INTERVAL)
            wait = max(FIRST_WRITE_DELAY, self._last_stream + STREAM_INTERVAL - time.monotonic())
            with trio.move_on_after(wait):
                await self.queue.wait_sealed(b)
            if not b.sealed and not b.ends_a_line():
                with trio.move_on_after(PARTIAL_LINE_HOLD):
                    await self.queue.wait_sealed(b, until_line=True)
        text = self.queue.take_text(b)
        msg = self.builder.iopub("stream", {"name": b.name, "text": text}, b.parent)
        self._last_stream = time.monotonic()
        self.stats.stream_messages += 1
        return serialize(msg, self.signer)

    async def _send(self, frames: list[bytes]) -> None:
        sock = self.sock
        try:
            _send_frames(sock, frames)
            self.degraded = False
        except zmq.Again:
            await self._send_waiting(frames)

    def _after_sends(self) -> None:
        """Our sends may have consumed the FD's edge for a pending subscription
        (zmq_getsockopt(3), ZMQ_FD): look, and wake the welcomer if so."""
        if int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            subscribers = self.subscribers
            subscribers.read()
            if (subscribers.welcomes or (self._held and subscribers.listening)) and self._sub_waiter is not None:
                self._sub_waiter.cancel()

    async def _send_waiting(self, frames: list[bytes]) -> None:
        if self.degraded:
            self._send_lossy(frames)
            return
        self.stats.waits += 1
        start = time.monotonic()
        delay = RETRY_MIN_DELAY
        warned = False
        try:
            while True:
                self._after_sends()  # subscriptions keep arriving while we wait
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
                try:
                    _send_frames(self.sock, frames)
                    return
                except zmq.Again:
                    pass
                waited = time.monotonic() - start
                if not warned and waited >= self.warn_after:
                    warned = True
                    self._warn_wait(
                        "iopub: a subscriber is not reading; waited %.1fs so far (waits=%d, fallback drops=%d)",
                        waited,
                        self.stats.waits,
                        self.stats.fallback_drops,
                    )
                if waited >= self.send_timeout:
                    self.degraded = True
                    self._send_lossy(frames)
                    return
        finally:
            waited = time.monotonic() - start
            self.stats.wait_seconds += waited
            self.stats.max_wait = max(self.stats.max_wait, waited)

    def _lossy(self, frames: list[bytes]) -> None:
        """Send once with NODROP off (full subscribers skip it), then restore."""
        sock = self.sock
        if not self.nodrop:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return
        sock.setsockopt(zmq.XPUB_NODROP, 0)
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        finally:
            sock.setsockopt(zmq.XPUB_NODROP, 1)

    def _send_lossy(self, frames: list[bytes]) -> None:
        self._lossy(frames)
        self.stats.fallback_drops += 1
        self._warn_drop(
            "iopub: a subscriber stalled past the %.1fs send timeout; it loses messages "
            "(fallback drops so far: %d). Other subscribers receive everything.",
            self.send_timeout,
            self.stats.fallback_drops,
        )

    async def _watch_subscriptions(self) -> None:
        """Welcome every new subscriber (JEP 65).

        Welcomes go through the same waiting send as everything else. A
        lossy send would make libzmq deactivate any subscriber whose pipe is
        full at that moment, and that subscriber would then silently miss
        messages until it drained (found by tests/test_iopub_queue.py).
        """
        fd = int(self.sock.getsockopt(zmq.FD))
        subscribers = self.subscribers
        while True:
            subscribers.read()
            await self._send_welcomes()
            if self._held and subscribers.listening:
                await self._flush_held()
                continue  # subscriptions may have come meanwhile
            with trio.CancelScope() as scope:
                self._sub_waiter = scope
                try:
                    await trio.lowlevel.wait_readable(fd)
                finally:
                    self._sub_waiter = None

    async def _send_welcomes(self) -> None:
        welcomes = self.subscribers.welcomes
        while welcomes:
            frames = welcomes.popleft()
            await self._send(frames)
            self.stats.welcomes += 1
            if self.message_log is not None:
                self.message_log.record("out", "iopub", frames)
            self._after_sends()
