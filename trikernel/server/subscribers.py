"""The IOPub subscribers as the kernel sees them: subscriptions, welcomes, connections.

docs/design.md, "The IOPub path"; docs/iopub.md, "Welcome", "Subscriptions"
and "Before the first subscriber". The iopub task (iopubtask.py) owns the
XPUB socket and its monitor socket and sends; :class:`Subscribers` reads
what comes in on them: subscription frames (XPUB_VERBOSE passes every one
on), each of which gets an ``iopub_welcome`` (JEP 65) built here, and the
monitor's connection events.

What a subscription costs before the kernel reads it. libzmq adds the
topic to its subscription tree as it decodes the frame: one node per topic
byte, about 48 bytes of heap each, and whenever a subscriber's pipe ends it
walks the whole tree, in the thread that calls into the socket: the io
thread, which also serves shell and control (libzmq 4.3.5
``generic_mtrie_t::rm``, unchanged on master). 50 subscribers of a 64 KiB
topic that close cost 9 s of io-thread time and 157 MiB. So the length of a
subscription is bounded on the wire: the XPUB's ``MAXMSGSIZE``
(:func:`iopub_maxmsgsize`, set before bind through sockopts) makes libzmq's
decoder drop a connection at its first frame over the bound, from the size
header, before anything is allocated or stored. Not ``XPUB_MANUAL``: in
4.3.5 it stores every subscription in a second tree before the kernel sees
it, walks both trees when a pipe ends, and lets a peer without a key shift
which pipe a later subscription is applied to (docs/iopub.md).

libzmq gives no reason for such a drop: its monitor shows a refused
subscriber as ACCEPTED, HANDSHAKE_SUCCEEDED, DISCONNECTED, as any client
that leaves at once (no protocol-error event; measured with 4.3.5). So the
kernel counts the connections that end less than :data:`SHORT_CONNECTION`
after they were accepted (``short_connections``; a client that leaves that
fast counts too) and, once :data:`SHORT_FLOOD` of them end within
:data:`SHORT_WINDOW`, logs them at the bounded rate of ``BadInputLog``
(one client that leaves at once is no news).
libzmq's SUB then reconnects after ``RECONNECT_IVL`` (100 ms) without
sending its subscriptions again (the dropped connection took them off its
pipe): it stays connected, subscribed to nothing, and is one more
connection that keeps the hold off, as a port scan that stays would.

What the bound cannot stop: many distinct short topics on one connection
(20,000 topics of 1 KiB: about 1 GiB in libzmq, and seconds of io-thread
time whenever another subscriber leaves). libzmq 4.3.5 has no limit per
connection and no way to drop one peer of an XPUB; CurveZMQ on the ports
is the answer. The kernel makes it visible: it counts the bytes of the
distinct topics libzmq holds (:attr:`Subscribers.topic_bytes`: each
subscription adds its topic once, the unsubscription libzmq passes on when
a topic's last subscriber leaves takes it away, and everything goes when
the XPUB has no connection left) and logs past :data:`TOPIC_BYTES_WARN`.
An estimate, not a bound: libzmq also passes on an unsubscription from a
peer that never subscribed to the topic, so a peer that means to can hide
topics from the count.

Connections and the hold. The iopub task holds what it would send until a
subscriber listens (iopubtask.py). :attr:`Subscribers.listening` says one
does: a subscription frame read from a live connection. It is cleared when
the XPUB has no connection left, counted from the monitor
(``EVENT_ACCEPTED`` - ``EVENT_DISCONNECTED``), not from unsubscription
frames, which any peer can send. A connection's ACCEPTED is emitted before
its handshake, so before its subscription can be read: a subscription read
always has its connection counted by then; one read while the count is 0
(every event read) is from a peer already gone and does not end the hold.

Runs on: the io thread's trio run (the iopub task calls it);
:func:`iopub_maxmsgsize` on any thread (pure).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from trikernel.core.badinput import BadInputLog
from trikernel.protocol.wire import serialize

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Signer
    from trikernel.server.iopubqueue import IOPubStats

log = logging.getLogger("trikernel.iopub")

#: Bytes a ZMTP 3.1 peer's SUBSCRIBE command adds to its topic on the wire
#: (the command name ``SUBSCRIBE`` and its length byte); a ZMTP 3.0 peer sends
#: ``b"\x01" + topic``, 1 byte.
SUBSCRIBE_OVERHEAD: Final = 10
#: The smallest iopub MAXMSGSIZE the kernel sets or accepts: MAXMSGSIZE applies
#: to every frame a peer sends, handshake commands included (a SUB's NULL READY
#: takes 28 bytes, a CURVE INITIATE 276; measured with libzmq 4.3.5).
IOPUB_MIN_MAXMSGSIZE: Final = 1024
#: Pending welcomes kept at most (one per subscription message).
WELCOME_BACKLOG = 1024
#: A connection that ends less than this many seconds after it was accepted
#: is counted in ``short_connections`` (module docstring).
SHORT_CONNECTION = 1.0
#: Short connections are logged (bad input, bounded rate) only from the
#: SHORT_FLOOD-th within SHORT_WINDOW seconds on: one client that starts a
#: kernel and leaves at once (``jupyter execute`` of a short notebook,
#: jupyter_client's ``start_new_kernel``) is normal; only a run of them is news.
SHORT_FLOOD = 10
SHORT_WINDOW = 10.0
#: Bytes of distinct topics libzmq holds (as counted) past which each further
#: subscription is logged (bounded rate): libzmq then holds
#: about 48 MiB for them and walks them all whenever a subscriber leaves
#: (about 0.1 s of io-thread time per MiB of topics).
TOPIC_BYTES_WARN = 1 << 20
#: Distinct topics remembered (as hashes) at most; past it a new topic counts its
#: bytes without being remembered (its unsubscription then takes nothing away).
MAX_TRACKED_TOPICS = 1 << 16


def iopub_maxmsgsize(max_topic_bytes: int) -> int:
    """The iopub XPUB's ``MAXMSGSIZE`` for the kernel's ``--max-topic-bytes``: a
    subscription longer than ``max_topic_bytes`` (plus 9 bytes from a ZMTP 3.0 peer)
    then costs its connection before libzmq stores it (module docstring).

    Args:
        max_topic_bytes: the longest topic that gets an ``iopub_welcome`` (bytes, >= 0).

    Returns:
        ``max(max_topic_bytes + SUBSCRIBE_OVERHEAD, IOPUB_MIN_MAXMSGSIZE)``, bytes.

    Runs on: any thread (pure).
    """
    return max(max_topic_bytes + SUBSCRIBE_OVERHEAD, IOPUB_MIN_MAXMSGSIZE)


class Subscribers:
    """What comes in on the XPUB and its monitor: subscriptions, welcomes, connections.

    Args:
        sock: the XPUB (XPUB_VERBOSE on); only :meth:`read` receives from it.
        builder, signer: build and sign each ``iopub_welcome``.
        stats: the IOPub counters (``short_connections``).
        bad_input: where refused subscription frames, short connections and
            subscriptions past :data:`TOPIC_BYTES_WARN` are counted and logged.
        max_topic_bytes: the longest topic welcomed (``--max-topic-bytes``).
        monitor: the XPUB's monitor socket (ACCEPTED and DISCONNECTED), or
            None: connections are not counted and :attr:`listening` is never
            cleared (the hold is for the first subscriber only).
        clock: monotonic seconds (tests pass a fake one).

    Runs on: the io run only (the iopub task's calls); the plain attributes
    may be read from any thread (``%trikernel``).
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        builder: MessageBuilder,
        signer: Signer,
        stats: IOPubStats,
        *,
        bad_input: BadInputLog | None = None,
        max_topic_bytes: int = 1024,
        monitor: zmq.Socket[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sock = sock
        self.builder = builder
        self.signer = signer
        self.stats = stats
        self.bad_input = bad_input if bad_input is not None else BadInputLog()
        self.max_topic_bytes = max_topic_bytes
        self.monitor = monitor
        self._clock = clock
        #: welcomes to send, oldest first (serialised frames)
        self.welcomes: deque[list[bytes]] = deque(maxlen=WELCOME_BACKLOG)
        #: a subscription frame from a live connection was read since the XPUB
        #: last had none: libzmq applied it, so someone listens
        self.listening = False
        #: connections of the XPUB now, from the monitor's events
        self.connections = 0
        self._accepted: dict[int, float] = {}  # fd -> when its ACCEPTED was read (live connections only)
        self._recent_short: deque[float] = deque()  # when the short connections of the last SHORT_WINDOW ended
        self._topics: set[int] = set()  # hash() of each distinct topic libzmq holds
        #: bytes of the distinct topics libzmq holds, as the subscription and
        #: unsubscription frames tell (an estimate: module docstring)
        self.topic_bytes = 0

    @property
    def topics(self) -> int:
        """Distinct topics libzmq holds, as the kernel counts them (up to
        :data:`MAX_TRACKED_TOPICS`). Any thread (a plain read)."""
        return len(self._topics)

    def read(self) -> None:
        """Read every subscription frame queued on the XPUB; queue a welcome for each
        acceptable one. Never sends (it runs inside the iopub task's sends)."""
        sock = self.sock
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            sub = frames[0] if frames else b""
            if sub[:1] != b"\x01":
                if sub[:1] != b"\x00" or len(frames) != 1:  # b"\x00...": an unsubscription
                    self.bad_input.record("iopub", "not_a_subscription", f"{len(frames)} frame(s), not a subscription")
                else:  # says nothing about who is left (module docstring); a topic may be gone
                    self._uncount_topic(sub[1:])
                continue
            if len(frames) == 1:
                self._count_topic(sub[1:])
                if self._from_a_live_connection():
                    self.listening = True  # libzmq applied it, long or not
            if len(frames) != 1 or len(sub) - 1 > self.max_topic_bytes:
                self.bad_input.record(
                    "iopub",
                    "bad_subscription",
                    f"subscription of {len(frames)} frame(s), topic of {len(sub) - 1} bytes "
                    f"(limit {self.max_topic_bytes}): no welcome",
                )
                continue
            topic = sub[1:]
            msg = self.builder.msg(
                "iopub_welcome", {"subscription": topic.decode("utf-8", "replace")}, None, identities=(topic,)
            )
            if len(self.welcomes) == self.welcomes.maxlen:
                self.bad_input.record(
                    "iopub",
                    "welcome_backlog",
                    f"more than {WELCOME_BACKLOG} subscriptions pending; oldest welcome dropped",
                )
            self.welcomes.append(serialize(msg, self.signer))

    def _count_topic(self, topic: bytes) -> None:
        """Count a topic libzmq applied (:attr:`topic_bytes`); log past :data:`TOPIC_BYTES_WARN`."""
        if not topic:
            return  # b"": what every Jupyter client subscribes; the tree's root
        key = hash(topic)
        if key in self._topics:
            return
        if len(self._topics) < MAX_TRACKED_TOPICS:
            self._topics.add(key)
        self.topic_bytes += len(topic)
        if self.topic_bytes > TOPIC_BYTES_WARN:
            self.bad_input.record(
                "iopub",
                "many_topics",
                f"kept, libzmq cannot refuse them: {self.topic_bytes} bytes of distinct topics subscribed (about "
                f"{self.topic_bytes * 48 >> 20} MiB in libzmq, all walked whenever a subscriber leaves); "
                "a peer without a key reaches the IOPub port: use CurveZMQ (docs/robustness.md)",
            )

    def _uncount_topic(self, topic: bytes) -> None:
        """An unsubscription: libzmq passes one on when a topic's last subscriber
        unsubscribed or left (XPUB_VERBOSE), and also one from a peer that never
        subscribed to it, which can hide a live topic from the count (module docstring)."""
        key = hash(topic)
        if topic and key in self._topics:
            self._topics.discard(key)
            self.topic_bytes -= len(topic)

    async def watch_connections(self) -> None:
        """Count the XPUB's connections for as long as the iopub task runs; the only
        reader of the monitor socket. Runs whenever there is a monitor, holding or
        not: libzmq's monitor_event sends without ZMQ_DONTWAIT, so a monitor nobody
        reads blocks the context's I/O thread once its pipe is full (about 2000
        events), and with it every socket of the context. io run."""
        assert self.monitor is not None
        fd = int(self.monitor.getsockopt(zmq.FD))
        while True:
            await trio.lowlevel.wait_readable(fd)
            self.read_connection_events()

    def read_connection_events(self) -> None:
        """Read every pending monitor event; with none left and no connection,
        :attr:`listening` is cleared (module docstring). io run."""
        assert self.monitor is not None
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = parse_monitor_message(frames)
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.connections += 1
                self._accepted[event["value"]] = self._clock()
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)
                since = self._accepted.pop(event["value"], None)
                if since is not None and self._clock() - since < SHORT_CONNECTION:
                    self._short_connection()
        if self.connections == 0:
            self._topics.clear()  # libzmq's tree is empty once every pipe is gone
            self.topic_bytes = 0
            if self.listening:
                self.listening = False
                log.debug("iopub: no connection left; held for the next subscriber from now on")

    def _short_connection(self) -> None:
        self.stats.short_connections += 1
        now = self._clock()
        recent = self._recent_short
        recent.append(now)
        while recent and now - recent[0] > SHORT_WINDOW:
            recent.popleft()
        if len(recent) < SHORT_FLOOD:
            log.debug(
                "iopub: a connection ended less than %gs after it was accepted (%d so far)",
                SHORT_CONNECTION,
                self.stats.short_connections,
            )
            return
        self.bad_input.record(
            "iopub",
            "short_connection",
            f"a connection ended less than {SHORT_CONNECTION:g}s after it was accepted "
            f"({self.stats.short_connections} so far): libzmq drops a subscriber whose subscription is "
            f"longer than {self.max_topic_bytes} bytes, without a reason, so a client that leaves this soon "
            "counts too",
        )

    def _from_a_live_connection(self) -> bool:
        """Whether a subscription frame just read can come from a connection that
        is still there. libzmq hands the XPUB what a peer sent before it left, and
        may do so after that connection's DISCONNECTED was read (a peer that
        subscribes and closes at once): such a subscription must not end the hold.
        Its ACCEPTED was emitted before it could be read, so with every pending
        event read, a count of 0 says its connection is gone. Without a monitor:
        True (the hold is for the first subscriber only)."""
        if self.monitor is None:
            return True
        self.read_connection_events()
        return self.connections > 0
