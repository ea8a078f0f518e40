"""The IOPub queue: one bounded queue every IOPub message goes through.

docs/design.md, "The IOPub path". Every IOPub message (status,
execute_input, stream, display_data, execute_result, error, clear_output,
comm_*) goes through ONE :class:`IOPubQueue`; its consumer is the iopub
task (iopubtask.py), the sole owner of the XPUB socket.

Why not a trio memory channel: producers live in other threads (the user
code's main thread, threads the user starts) and in the io run itself; a
trio channel belongs to one run. The queue is a deque of at most
``capacity`` credits, guarded by one ``threading.Lock`` with a
``threading.Condition`` producers wait on: a producer takes a credit
before it appends (blocking = backpressure), the iopub task gives it back
after the message left through libzmq. Queue + in-flight never exceed
``capacity`` messages. FIFO across all producers gives busy < execute_input
< outputs < idle by construction.

stream coalescing: ``write_stream`` appends text to the *open* batch of that
stream (no credit needed) while the batch waits in the queue; any other
message, another stream or a new parent seals it. So a print flood becomes
few large ``stream`` messages; the first write of a burst leaves at once.

Order across channels (issue 26): a message for another socket (a shell
reply, an ``input_request``) must not leave before the IOPub messages
queued ahead of it. :meth:`IOPubQueue.put_ordered` queues its send as an
:class:`Ordered` marker in this same FIFO, and the iopub task runs it right
after everything ahead of it was handed to the XPUB; when nothing is queued
or in flight it returns False and the caller sends at once (the fast path).

Runs on: any thread (the producers, by method); the consumer's methods in
the io run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from trikernel.protocol.wire import Message, Signer, serialize

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.iopub")

#: Messages io-run producers (status from the channel tasks) may queue past
#: ``capacity``, so that kernel_info, interrupt and shutdown replies never wait
#: behind a stalled subscriber; past it they wait like everyone else.
IO_OVERDRAFT = 64
#: Seconds the iopub task waits, after another thread woke it in the middle
#: of a burst, before it drains the queue: the producer queues a batch
#: meanwhile, so a cell that emits many messages costs one thread switch
#: per batch, not per message.
GATHER_WINDOW = 0.0005
#: A wake-up less than this many seconds after the task last took messages
#: is part of a burst (gather first); a later one is a lone message (an
#: execute_input, the first line of output) and is sent at once.
BURST_GAP = 0.002


@dataclass
class IOPubStats:
    """Counters of the IOPub path; read them with ``%trikernel``.

    - ``sent``: messages that left through libzmq.
    - ``waits``: sends that met a full subscriber (NODROP EAGAIN) and waited.
    - ``wait_seconds``: total seconds spent in such waits.
    - ``max_wait``: longest single wait, seconds.
    - ``fallback_drops``: fallback events — messages sent lossy after
      ``send_timeout`` or in degraded mode. Each cuts off at least one
      stalled subscriber: libzmq then skips that subscriber's pipe until it
      has drained to its low-water mark, so it misses every message until it
      reads again. The messages it misses are not counted (libzmq does not
      report them); this counts the cut-offs.
    - ``welcomes``: ``iopub_welcome`` messages sent.
    - ``held``: messages held while no one listened; each is sent to the
      next subscriber after its welcome, or counted in ``hold_drops``.
    - ``hold_drops``: held messages dropped, oldest first, past
      ``hold_bytes``, or still held at shutdown (nobody ever subscribed).
    - ``stream_messages`` / ``stream_writes``: coalescing ratio.
    - ``producer_blocks``: times a producer found the queue full and waited.
    - ``send_errors``: messages that could not be serialised or sent (bug
      or bad data; each is logged with its traceback).
    - ``dropped_closed``: messages produced after the queue closed at
      shutdown (user threads still printing); dropped, never blocked on.
    - ``silenced``: output of ``silent`` execute requests not broadcast, as
      the spec asks (stream writes and display/result/error messages).
    - ``short_connections``: IOPub connections that ended less than a second
      after they were accepted: libzmq drops a subscriber whose subscription
      is longer than ``--max-topic-bytes`` that way, without a reason, so a
      client that leaves that soon counts too (server/subscribers.py).
    """

    sent: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    max_wait: float = 0.0
    fallback_drops: int = 0
    welcomes: int = 0
    held: int = 0
    hold_drops: int = 0
    stream_messages: int = 0
    stream_writes: int = 0
    producer_blocks: int = 0
    send_errors: int = 0
    dropped_closed: int = 0
    silenced: int = 0
    short_connections: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A copy of every counter as a dict (name → int, or float seconds for ``wait_seconds``
        and ``max_wait``), for ``%trikernel``. Any thread: a plain copy, not one consistent
        snapshot (the iopub task and producers update counters meanwhile)."""
        return dict(self.__dict__)


@dataclass(eq=False)
class StreamBatch:
    """Text of one stream for one parent, collected while queued."""

    name: str
    parent: dict[str, Any]
    parts: list[str] = field(default_factory=list)
    size: int = 0
    sealed: bool = False
    #: set when the batch is sealed while the iopub task holds it open
    #: (io run's Event; see IOPubQueue.wait_sealed)
    on_seal: trio.Event | None = None
    #: with ``until_line``: also set when text ending a line is appended, or on flush()
    on_line: trio.Event | None = None
    #: the stream's flush() came after the last text: it leaves without waiting for a newline
    flushed: bool = False

    def ends_a_line(self) -> bool:
        """Whether the text so far ends with a newline (``print``'s second write came) or
        was flushed (``print(..., end="", flush=True)``): then it need not wait for more."""
        return self.flushed or (bool(self.parts) and self.parts[-1].endswith("\n"))


class _Close:
    pass


class Ordered:
    """A send on another socket, kept in the IOPub FIFO (module docstring).

    ``send``: called once, in the io run, by the iopub task, right after
    every item queued ahead of it was handed to the XPUB (or held for the
    next subscriber); it must not raise (the sender logs its own errors).
    An Ordered marker takes no credit: there is at most one per request in
    flight (its reply) and one per pending ``input()``.
    """

    __slots__ = ("send",)

    def __init__(self, send: Callable[[], None]):
        self.send = send


_CLOSE = _Close()
_Item = tuple[str, list[bytes]] | StreamBatch | Ordered | _Close


class IOPubQueue:
    """Bounded multi-producer queue into the iopub task (thread-safe).

    ``capacity``: messages (queued + in flight) before producers block.
    ``stream_batch_chars``: a stream batch is sealed past this many
    characters of text. ``signer``: signs every message a producer queues.

    Producers: :meth:`put_from_thread` and :meth:`write_stream` from any
    thread but the io thread, :meth:`put` from tasks of the io run. The
    consumer (:meth:`get`, :meth:`take_text`, :meth:`release`) is the iopub
    task alone.
    """

    def __init__(self, capacity: int, stream_batch_chars: int, stats: IOPubStats, signer: Signer):
        self.capacity = capacity
        # One lock guards items, open batches and credits; producers in other
        # threads wait for a credit on _space (interruptible by Ctrl-C).
        self._free = capacity
        self.signer = signer
        self.stream_batch_chars = stream_batch_chars
        self.stats = stats
        self._items: deque[_Item] = deque()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._open: dict[str, StreamBatch] = {}
        self._consumer_wake: trio.Event | None = None
        self._io_token: trio.lowlevel.TrioToken | None = None
        self._io_thread: int | None = None
        self._credit_returned: trio.Event | None = None
        self._overdraft = 0  # io-run messages queued past capacity (<= IO_OVERDRAFT)
        self._last_take = -1.0  # time.monotonic() of the consumer's last take
        self._last_take_from_thread = False  # that take held items queued by another thread
        # items queued by another thread since the last take that emptied the
        # queue: after a wait (the queue was empty), whether a thread woke it
        self._thread_items = False
        # a status message is queued: the burst is over (idle ends a request),
        # so the next wake-up sends at once instead of gathering
        self._status_queued = False
        self.closed = False

    # -- wiring -----------------------------------------------------------
    def attach(self) -> None:
        """Called once from the io run: remember its token and thread."""
        self._io_token = trio.lowlevel.current_trio_token()
        self._io_thread = threading.get_ident()

    @property
    def in_io_thread(self) -> bool:
        """Whether the caller runs on the io thread (the one that called :meth:`attach`); False
        on every thread before then. Producers use it to pick the io-run path. Any thread."""
        return threading.get_ident() == self._io_thread

    # -- producers ----------------------------------------------------------
    def _take_credit_locked(self) -> bool:
        """With the lock held: take a credit, waiting for one if none is free.

        Returns False, taking nothing, once the queue is closed (also when it
        closes while this producer waits: close() wakes every waiter).
        """
        if self._free == 0 and not self.closed:
            self.stats.producer_blocks += 1
            while self._free == 0 and not self.closed:
                self._space.wait()  # releases the lock meanwhile; Ctrl-C interrupts it
        if self.closed:
            self.stats.dropped_closed += 1
            return False
        self._free -= 1
        return True

    def _append_locked(self, item: _Item) -> None:
        # any non-stream item seals every open batch (keeps write order)
        for b in self._open.values():
            b.sealed = True
            if b.on_seal is not None:  # the iopub task holds it open: let it go now
                self._wake(b.on_seal)
                b.on_seal = None
        self._open.clear()
        if isinstance(item, StreamBatch):
            self._open[item.name] = item
        elif isinstance(item, Ordered) or (isinstance(item, tuple) and item[0] == "status"):
            self._status_queued = True  # a status or a reply ends the request's burst: no gathering
        self._items.append(item)
        if not self.in_io_thread:
            self._thread_items = True
        if self._consumer_wake is not None:
            ev, self._consumer_wake = self._consumer_wake, None
            self._wake(ev)

    def _wake(self, ev: trio.Event) -> None:
        """Set an io-run Event from any thread (lock held)."""
        if self.in_io_thread:
            ev.set()
        else:
            assert self._io_token is not None
            self._io_token.run_sync_soon(ev.set)

    def put_from_thread(self, msg: Message) -> bool:
        """Queue ``msg`` from any thread but the io thread; blocks while full.

        Serialises and signs in the caller's thread. Blocks (backpressure)
        while ``capacity`` messages are queued or in flight; Ctrl-C
        interrupts the wait on the main thread. Returns False, and counts
        ``dropped_closed``, when the queue is closed (the kernel is shutting
        down), including when it closes during the wait.

        Raises RuntimeError when called from the io thread (use :meth:`put`).
        """
        if self.in_io_thread:
            raise RuntimeError("IOPubQueue.put_from_thread from the io thread; use put")
        if self.closed:  # shutdown: a thread that keeps producing must not pay the signing
            with self._lock:
                self.stats.dropped_closed += 1
            return False
        frames = serialize(msg, self.signer)
        with self._lock:
            if not self._take_credit_locked():
                return False
            self._append_locked((msg.msg_type, frames))
        return True

    def put_ordered(self, send: Callable[[], None]) -> bool:
        """Queue ``send`` (a send on another socket) behind every IOPub
        message queued so far, as an :class:`Ordered` marker; never waits.

        Returns False, queueing nothing, when nothing is queued or in flight
        (every message queued before now has been handed to the XPUB) or
        the queue is closed (the iopub task takes nothing after its close
        marker): the caller then sends at once. Seals open stream batches
        and ends a gathering wait, like a ``status``. Any thread.
        """
        with self._lock:
            if self.closed or (not self._items and self._free == self.capacity and self._overdraft == 0):
                return False
            self._append_locked(Ordered(send))
        return True

    def put_status_nowait(self, msg: Message) -> bool:
        """Queue a ``status`` message from any thread but the io thread,
        never waiting: a credit, else the overdraft :meth:`put` uses (so
        status never waits behind a stalled subscriber). Returns False,
        queueing nothing, when neither is left or the queue is closed: the
        caller then leaves the message to the io run (core/kernelcore.py,
        "Replies"). Raises RuntimeError from the io thread.
        """
        frames = serialize(msg, self.signer)
        if self.in_io_thread:
            raise RuntimeError("IOPubQueue.put_status_nowait from the io thread; use send")
        with self._lock:
            return not self.closed and self._append_with_overdraft_locked((msg.msg_type, frames))

    def _append_with_overdraft_locked(self, item: _Item) -> bool:
        """With the lock held: queue ``item`` on a credit, else on the io
        overdraft (at most IO_OVERDRAFT past capacity); False, queueing
        nothing, when neither is left."""
        if self._free > 0:
            self._free -= 1
        elif self._overdraft < IO_OVERDRAFT:
            self._overdraft += 1
        else:
            return False
        self._append_locked(item)
        return True

    async def put(self, msg: Message) -> bool:
        """Queue ``msg`` from a task of the io run; waits while full.

        May go up to IO_OVERDRAFT messages past the capacity first, so that
        status and control traffic never waits behind a stalled subscriber.
        Returns False (counted in ``dropped_closed``) when the queue is
        closed. Cancellation: a cancelled wait queues nothing.
        """
        frames = serialize(msg, self.signer)
        while True:
            with self._lock:
                if self.closed:
                    self.stats.dropped_closed += 1
                    return False
                if self._append_with_overdraft_locked((msg.msg_type, frames)):
                    return True
                self.stats.producer_blocks += 1
                if self._credit_returned is None:
                    self._credit_returned = trio.Event()
                ev = self._credit_returned
            await ev.wait()

    def write_stream(self, name: str, text: str, parent: dict[str, Any]) -> None:
        """Append ``text`` to stream ``name`` (stdout/stderr) for ``parent``.

        Coalesces into the open batch when possible; otherwise takes a credit
        (may block) and queues a new batch.
        """
        self.stats.stream_writes += 1
        pid = parent.get("msg_id")
        with self._lock:
            b = self._open.get(name)
            if b is not None and not b.sealed and b.parent.get("msg_id") == pid and b.size < self.stream_batch_chars:
                b.parts.append(text)
                b.size += len(text)
                b.flushed = False
                if b.on_line is not None and text.endswith("\n"):
                    self._wake(b.on_line)
                    b.on_line = None
                return
            if not self._take_credit_locked():
                return
            self._append_locked(StreamBatch(name, parent, [text], len(text)))

    def flush_stream(self, name: str) -> None:
        """``flush()`` of stream ``name``: its open batch is marked flushed, so the iopub
        task does not hold it for the rest of a line (PARTIAL_LINE_HOLD); more text may
        still join it until it leaves. Any thread."""
        with self._lock:
            b = self._open.get(name)
            if b is None or b.sealed:
                return
            b.flushed = True
            if b.on_line is not None:
                self._wake(b.on_line)
                b.on_line = None

    # -- consumer -----------------------------------------------------------
    async def get(self, limit: int = 1) -> list[_Item]:
        """Wait for items; return up to ``limit`` of them, oldest first.

        Adaptive batching: woken by another thread in the middle of a burst
        (the last take, less than BURST_GAP ago, held items that thread
        queued too), it waits GATHER_WINDOW so the producer queues a batch.
        A lone message after a pause goes at once, and so does the first one
        from another thread after the io run's own (the ``execute_input``
        after ``busy``): waiting there would hold the cell's ``idle`` behind
        the window (trio's epoll rounds it up to 1 ms; issue 12). Nor does
        it wait when a ``status`` message is queued: ``idle`` ends the
        request's output, whichever thread queued it (core/kernelcore.py, "Replies").
        """
        while True:
            with self._lock:
                if self._items:
                    items = self._items
                    self._last_take = time.monotonic()
                    self._last_take_from_thread = self._thread_items
                    taken = [items.popleft() for _ in range(min(limit, len(items)))]
                    if not items:  # what is left of a long queue may be that thread's too
                        self._thread_items = False
                        self._status_queued = False
                    return taken
                ev = self._consumer_wake = trio.Event()
            await ev.wait()
            in_burst = self._last_take_from_thread and time.monotonic() - self._last_take < BURST_GAP
            if self._thread_items and in_burst and not self._status_queued:
                # a cell producing output: let it queue a batch before we
                # take the GIL back, instead of one thread switch per message
                await trio.sleep(GATHER_WINDOW)

    async def wait_sealed(self, b: StreamBatch, until_line: bool = False) -> None:
        """The iopub task holds the open tail batch ``b`` for more text until
        another message seals it (so an idle or a display right after a print
        is not delayed); returns at once if it is sealed already.
        ``until_line``: also return once ``b``'s text ends a line (at once if
        it does already), so a ``print`` whose newline write comes late is
        still one message.

        Cancellation: the caller bounds the hold with a cancel scope
        (``trio.move_on_after``); cancelled, the hold ends and ``b`` stays
        open for :meth:`take_text`. Io run only."""
        with self._lock:
            if b.sealed or (until_line and b.ends_a_line()):
                return
            ev = b.on_seal = trio.Event()
            if until_line:
                b.on_line = ev
        try:
            await ev.wait()
        finally:
            with self._lock:
                b.on_seal = None
                b.on_line = None

    def take_text(self, b: StreamBatch) -> str:
        """Seal stream batch ``b`` (later writes open a new batch) and return its text, all parts
        joined, emptying it; the batch's credit stays taken until :meth:`release`. Consumer
        only: the iopub task, in the io run."""
        with self._lock:
            b.sealed = True
            if self._open.get(b.name) is b:
                del self._open[b.name]
            text = "".join(b.parts)
            b.parts.clear()
        return text

    def release(self, n: int = 1) -> None:
        """Return ``n`` units for messages that left: overdraft first, then credits."""
        with self._lock:
            paid = min(n, self._overdraft)
            self._overdraft -= paid
            if n > paid:
                self._free += n - paid
                self._space.notify(n - paid)
            ev, self._credit_returned = self._credit_returned, None
        if ev is not None:
            ev.set()

    def close(self) -> None:
        """Queue the end marker (from the io run); the task drains, then exits.

        Producers waiting for a credit wake up and drop their message
        (``dropped_closed``); later producers drop at once. Nothing blocks on
        a closed queue.
        """
        with self._lock:
            self.closed = True
            self._append_locked(_CLOSE)
            self._space.notify_all()
            ev, self._credit_returned = self._credit_returned, None
        if ev is not None:
            ev.set()

    def __len__(self) -> int:
        return len(self._items)


#: pyzmq's Cython send, without the sugar layer's keyword handling
#: (0.13 us instead of 0.36 us a frame; a message is 7+ frames).
