"""Tier 3 without a kernel: TrioSocket and zmq-anyio side by side on real sockets.

The same tests run against trikernel's ``sockets.TrioSocket`` and against
zmq-anyio's ``Socket``, each driving a ROUTER (the kernel's side) from a trio
run; the peer is a plain pyzmq DEALER (a client). A thin test-only adapter
gives both the same interface: ``await recv()``, and ``recv_nowait()`` and
``send()`` that neither block nor checkpoint. zmq-anyio is driven only
through its own wrapper (every call goes through ``zmq_anyio.Socket``), as
its design requires.

Covered, for both:
- the ``ZMQ_FD`` edge (zmq_getsockopt(3), "ZMQ_FD"). First the premise on a
  bare socket: once the socket's commands are processed, the FD stays
  unreadable although a message is queued. Then: a send made while the
  reader waits, after a message arrived, resets the FD; the message must
  still be read (500 forced races, each checked to have really reset the
  FD; then a stress with requests, replies and unsolicited sends from a
  second task). And a non-blocking receive by another task while the
  reader waits must not leave the reader asleep over a queued message;
- the same edge on the iopub task's XPUB (trikernel's IOPubTask only): a
  send made in the batch after a subscription arrived must not leave the
  welcomer asleep over it (200 forced races);
- ordering: messages are read in the order sent;
- cancellation: a receive cancelled while it waits loses no message, and a
  receive cancelled at its checkpoint while a message is queued leaves the
  message queued;
- fairness: a flood on one socket does not starve the run's other tasks;
- a second client with the same DEALER identity (as two clients of one
  jupyter_client ``KernelManager`` have) under ROUTER_HANDOVER off and on:
  what libzmq does, the same with either adapter, recorded as a fact.

zmq-anyio's known faults are ``xfail(strict=True)`` with the version and
the fault: a zmq-anyio release that fixes one turns the run red (XPASS),
and the choice written in docs/design.md ("Sockets") is judged again.
"""

from __future__ import annotations

import importlib.metadata
import select
import threading
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import pytest
import trio
import trio.testing
import zmq

from trikernel.protocol.messages import MessageBuilder
from trikernel.protocol.wire import Signer
from trikernel.server.iopubqueue import IOPubQueue, IOPubStats
from trikernel.server.iopubtask import IOPubTask
from trikernel.server.sockets import TrioSocket

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

try:
    import zmq_anyio
except ImportError as exc:  # pragma: no cover - the test extra installs it
    zmq_anyio = None  # type: ignore[assignment]
    ZMQ_ANYIO = f"not installed ({exc})"
else:
    ZMQ_ANYIO = importlib.metadata.version("zmq-anyio")

pytestmark = pytest.mark.timeout(60)

#: Seconds a trio run of one test may take before it fails (loaded 2-core machine).
DEADLINE = 20.0
#: Seconds to wait for something that must NOT happen (a negative check can only be bounded).
ABSENCE = 0.5
IDENTITY = b"client"

FAULT_CANCELLED_WAIT = (
    f"zmq-anyio {ZMQ_ANYIO}: a cancelled `await arecv_multipart()` leaves its future queued "
    "(_recv_futures); the next message is received into it and lost"
)
FAULT_CANCELLED_CHECKPOINT = (
    f"zmq-anyio {ZMQ_ANYIO}: arecv_multipart() takes a queued message off the socket before "
    "the await; cancelled at trio's checkpoint (Event.wait), the message is dropped"
)
FAULT_NOWAIT_BESIDE_WAITER = (
    f"zmq-anyio {ZMQ_ANYIO}: a DONTWAIT arecv_multipart() resets ZMQ_FD without re-checking "
    "ZMQ_EVENTS; a receive already waiting sleeps while a message is queued"
)
#: Seconds a reader that was woken may take to return (no I/O left to wait for).
WAKE = 2.0


class Adapter(Protocol):
    """What the tests need from a socket driver, in one trio run."""

    async def recv(self) -> list[bytes]:
        """The next message's frames; cancellable."""
        ...

    def recv_nowait(self) -> list[bytes] | None:
        """The next message's frames if one is queued, else None; no checkpoint."""
        ...

    def send(self, frames: list[bytes]) -> None:
        """Send now, without blocking and without a checkpoint."""
        ...


class TrioSocketAdapter:
    """trikernel's TrioSocket as the kernel uses it."""

    def __init__(self, sock: zmq.Socket[Any]):
        self._s = TrioSocket(sock, "test")

    @property
    def socket(self) -> TrioSocket:
        """The TrioSocket itself (for what only it has: send_from_thread)."""
        return self._s

    async def recv(self) -> list[bytes]:
        return await self._s.recv_multipart()

    def recv_nowait(self) -> list[bytes] | None:
        return self._s.recv_multipart_nowait()

    def send(self, frames: list[bytes]) -> None:
        assert self._s.send_nowait(frames)

    @classmethod
    @asynccontextmanager
    async def open(cls, sock: zmq.Socket[Any]) -> AsyncIterator[Adapter]:
        try:
            yield cls(sock)
        finally:
            sock.close(linger=0)


class ZmqAnyioAdapter:
    """zmq-anyio's Socket wrapping the same pyzmq socket (it shadows it)."""

    def __init__(self, s: Any):
        self._s = s

    async def recv(self) -> list[bytes]:
        frames: list[bytes] = await self._s.arecv_multipart()
        return frames

    def recv_nowait(self) -> list[bytes] | None:
        # through the wrapper: a DONTWAIT receive resolves its future at once
        future = self._s.arecv_multipart(flags=zmq.DONTWAIT)
        if isinstance(future.exception, zmq.Again):
            return None
        frames: list[bytes] = future.return_value
        return frames

    def send(self, frames: list[bytes]) -> None:
        # zmq_anyio.Socket.send_multipart sends at once (DONTWAIT) and then
        # re-checks ZMQ_EVENTS for waiting receivers
        self._s.send_multipart(frames)

    @classmethod
    @asynccontextmanager
    async def open(cls, sock: zmq.Socket[Any]) -> AsyncIterator[Adapter]:
        assert zmq_anyio is not None
        async with zmq_anyio.Socket(sock) as s:  # closes sock on exit
            yield cls(s)


AdapterType = type[TrioSocketAdapter] | type[ZmqAnyioAdapter]


def adapters(zmq_anyio_fault: str | None = None) -> list[Any]:
    """Parameters for both adapters; zmq-anyio xfails strictly with ``zmq_anyio_fault``."""
    marks: list[Any] = [pytest.mark.skipif(zmq_anyio is None, reason=f"zmq-anyio {ZMQ_ANYIO}")]
    if zmq_anyio_fault is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=zmq_anyio_fault))
    return [
        pytest.param(TrioSocketAdapter, id="TrioSocket"),
        pytest.param(ZmqAnyioAdapter, id="zmq-anyio", marks=marks),
    ]


class Pair:
    """A ROUTER (the kernel's side, for an adapter) and a DEALER peer (identity ``client``)."""

    def __init__(self, transport: str = "tcp"):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # as sockets.create_and_bind does
        if transport == "tcp":
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.url = f"tcp://127.0.0.1:{port}"
        else:
            # inproc: a send returns after the message is in the ROUTER's
            # pipe, so "a message is already queued" is a fact, not a wait
            self.url = f"inproc://test-sockets-{id(self)}"
            self.router.bind(self.url)
        self.fd = int(self.router.getsockopt(zmq.FD))  # ZMQ_FD: reading it processes nothing
        self.peer = self.dealer(IDENTITY)

    def dealer(self, identity: bytes) -> zmq.Socket[Any]:
        s = self.ctx.socket(zmq.DEALER)
        s.linger = 0
        s.identity = identity
        s.rcvtimeo = int(DEADLINE * 1000)
        s.connect(self.url)
        return s

    def fd_readable(self, timeout: float = 0.0) -> bool:
        """Whether the ROUTER's ZMQ_FD is readable now (select; consumes nothing)."""
        return bool(select.select([self.fd], [], [], timeout)[0])

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


@pytest.fixture
def inproc_pair() -> Iterator[Pair]:
    p = Pair("inproc")
    yield p
    p.close()


def run(adapter: AdapterType, sock: zmq.Socket[Any], body: Callable[[Adapter], Awaitable[None]]) -> None:
    """Run ``body(adapter)`` in a fresh trio run, with DEADLINE."""

    async def main() -> None:
        with trio.fail_after(DEADLINE):
            async with adapter.open(sock) as a:
                await body(a)

    trio.run(main)


async def connected(a: Adapter, peer: zmq.Socket[Any]) -> None:
    """The peer says hello and the adapter reads it: the ROUTER knows its identity."""
    peer.send_multipart([b"hello"])
    assert await a.recv() == [IDENTITY, b"hello"]


# ---------------------------------------------------------------- the ZMQ_FD edge


def test_zmq_fd_edge_is_reset_by_reading_events(pair: Pair) -> None:
    """The premise, on a bare pyzmq socket (zmq_getsockopt(3), "ZMQ_FD"): once
    something processes the socket's commands (a send may, reading
    ZMQ_EVENTS or a recv always does), the FD stops being readable although
    a message is queued, and a task waiting on it sleeps."""
    pair.peer.send_multipart([b"hello"])
    assert pair.router.recv_multipart() == [IDENTITY, b"hello"]
    # nothing queued: the pipe is found empty, so the next message signals the FD
    assert not int(pair.router.getsockopt(zmq.EVENTS)) & zmq.POLLIN
    woken = False

    async def waiter() -> None:
        nonlocal woken
        with trio.move_on_after(ABSENCE):  # what must not come, bounded
            await trio.lowlevel.wait_readable(pair.fd)
            woken = True

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            pair.peer.send_multipart([b"req"])
            assert pair.fd_readable(DEADLINE), "the request never arrived"
            assert int(pair.router.getsockopt(zmq.EVENTS)) & zmq.POLLIN
            assert not pair.fd_readable()

    trio.run(main)
    assert not woken
    assert pair.router.recv_multipart(zmq.NOBLOCK) == [IDENTITY, b"req"]


RACES = 500


async def forced_races(a: Adapter, pair: Pair, send: Callable[[list[bytes]], None]) -> int:
    """RACES forced races: a message arrives (the FD is readable) while the
    reader waits, and before the run can wake the reader, ``send`` on the
    same socket consumes the edge. Asserts the reader still gets every
    message and the peer every reply; returns how many sends really
    consumed the edge (the test is only worth something if most did)."""
    await connected(a, pair.peer)
    forced = 0
    got: list[list[bytes]] = []

    async def reader() -> None:
        got.append(await a.recv())

    for i in range(RACES):
        got.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # the reader waits on ZMQ_FD
            pair.peer.send_multipart([b"req", b"%d" % i])
            # block the run (no checkpoint) until libzmq signals the FD ...
            assert pair.fd_readable(DEADLINE), "the request never arrived"
            # ... then send: each adapter reads ZMQ_EVENTS after a send,
            # which resets the FD, so the run never sees it readable (a
            # bare send resets it only when libzmq's command throttle
            # lets it process commands: a few sends in a hundred)
            send([IDENTITY, b"rep", b"%d" % i])
            forced += not pair.fd_readable()
        assert got == [[IDENTITY, b"req", b"%d" % i]]
    for i in range(RACES):
        assert pair.peer.recv_multipart() == [b"rep", b"%d" % i]
    return forced


@pytest.mark.parametrize("adapter", adapters())
def test_send_while_reader_waits_loses_no_message(adapter: AdapterType, pair: Pair) -> None:
    """500 forced races (forced_races), the send made by the run itself."""
    forced: list[int] = []

    async def body(a: Adapter) -> None:
        forced.append(await forced_races(a, pair, a.send))

    run(adapter, pair.router, body)
    assert forced[0] >= RACES // 2, f"only {forced[0]} of {RACES} sends consumed the edge"


def test_send_from_another_thread_while_reader_waits_loses_no_message(pair: Pair) -> None:
    """TrioSocket.send_from_thread (the shell's replies, sent by the thread
    that ran the request): the same 500 forced races, the send made by
    another thread while the run is blocked. That send consumes the FD edge
    too; it must wake the reader through the run's token."""
    forced: list[int] = []

    async def body(a: Adapter) -> None:
        assert isinstance(a, TrioSocketAdapter)
        token = trio.lowlevel.current_trio_token()

        def send_in_a_thread(frames: list[bytes]) -> None:
            sent: list[bool] = []
            t = threading.Thread(target=lambda: sent.append(a.socket.send_from_thread(frames, token)))
            t.start()
            t.join(DEADLINE)  # the run stays blocked: only the token can wake the reader
            assert sent == [True]

        forced.append(await forced_races(a, pair, send_in_a_thread))

    run(TrioSocketAdapter, pair.router, body)
    assert forced[0] >= RACES // 2, f"only {forced[0]} of {RACES} sends consumed the edge"


XPUB_RACES = 200


def test_iopub_send_that_consumed_a_subscriptions_edge_still_welcomes_it() -> None:
    """The same edge on the kernel's other socket that two tasks share: the
    iopub task's XPUB, where the welcomer waits on ``ZMQ_FD`` for
    subscriptions (XPUB_VERBOSE) while the run loop sends. XPUB_RACES forced
    races, each in one batch of the run loop: a subscription arrives (the
    FD is readable, checked), then the loop sends a message, which
    processes the XPUB's commands and so resets the FD before the run can
    wake the welcomer. The subscriber must still get its ``iopub_welcome``
    (the loop re-checks ``ZMQ_EVENTS`` after its sends:
    ``IOPubTask._after_sends``); without that re-check every race loses it
    (measured: 30 of 30), since no other traffic comes to wake the welcomer.
    inproc: a subscription is in the XPUB's pipe when ``setsockopt`` returns."""
    ctx = zmq.Context()
    xpub = ctx.socket(zmq.XPUB)
    xpub.linger = 0
    xpub.setsockopt(zmq.XPUB_NODROP, 1)  # as the kernel's defaults (sockopts.DEFAULTS)
    xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
    url = f"inproc://test-sockets-xpub-{id(xpub)}"
    xpub.bind(url)
    fd = int(xpub.getsockopt(zmq.FD))
    builder = MessageBuilder()
    queue = IOPubQueue(1000, 1 << 16, IOPubStats(), Signer(b"key"))
    task = IOPubTask(xpub, queue, builder, send_timeout=DEADLINE, warn_after=DEADLINE, hold_bytes=0)
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.connect(url)
    arrived: list[bool] = []  # per race: the subscription made the FD readable
    forced: list[bool] = []  # per race: the send after it left the FD unreadable
    welcomed: list[int] = []

    def readable(timeout: float = 0.0) -> bool:
        return bool(select.select([fd], [], [], timeout)[0])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(task.run)
            for i in range(XPUB_RACES):
                topic = b"race-%d" % i

                def subscribe(topic: bytes = topic) -> None:
                    # an Ordered send: runs in the run loop, inside its batch
                    sub.setsockopt(zmq.SUBSCRIBE, topic)
                    arrived.append(readable(DEADLINE))
                    # past libzmq's command throttle (about 1 ms), so that the
                    # next send processes the commands and resets the FD
                    time.sleep(0.002)

                await trio.testing.wait_all_tasks_blocked()  # the welcomer waits on the FD
                await queue.put(builder.iopub("status", {"execution_state": "busy"}, None))
                assert queue.put_ordered(subscribe)
                await queue.put(builder.iopub("status", {"execution_state": "idle"}, None))
                assert queue.put_ordered(lambda: forced.append(not readable()))
                with trio.move_on_after(DEADLINE):  # a lost welcome never comes: nothing else wakes the welcomer
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            await trio.sleep(0.001)
                            continue
                        if frames[0] == topic:
                            welcomed.append(i)
                            break
                if welcomed[-1:] != [i]:
                    break
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        ctx.destroy(linger=0)
    assert welcomed == list(range(XPUB_RACES)), f"race {len(welcomed)}: no welcome"
    assert arrived == [True] * XPUB_RACES
    assert sum(forced) >= XPUB_RACES // 2, f"only {sum(forced)} of {XPUB_RACES} sends consumed the edge"


def test_send_from_thread_to_a_peer_that_is_gone_is_counted(pair: Pair) -> None:
    """An unroutable reply from another thread is what it is from the run:
    False, counted in ``dropped`` (ROUTER_MANDATORY), no exception."""
    sock = TrioSocket(pair.router, "test")

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        ok = await trio.to_thread.run_sync(lambda: sock.send_from_thread([b"nobody", b"rep"], token))
        assert ok is False
        assert sock.dropped == 1

    trio.run(main)


@pytest.mark.parametrize("adapter", adapters(zmq_anyio_fault=FAULT_NOWAIT_BESIDE_WAITER))
def test_nowait_receive_beside_a_waiting_reader(adapter: AdapterType, inproc_pair: Pair) -> None:
    """While the reader waits, another task takes one of two queued messages
    without waiting (the kernel drains the shell socket this way when
    stop_on_error opens an abort window). The reader must get the other."""
    p = inproc_pair

    async def body(a: Adapter) -> None:
        await connected(a, p.peer)
        got: list[list[bytes]] = []
        done = trio.Event()

        async def reader() -> None:
            got.append(await a.recv())
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # the reader waits on ZMQ_FD
            p.peer.send_multipart([b"m1"])
            p.peer.send_multipart([b"m2"])
            assert a.recv_nowait() == [IDENTITY, b"m1"]
            with trio.fail_after(WAKE):
                await done.wait()
        assert got == [[IDENTITY, b"m2"]]

    run(adapter, p.router, body)


STRESS = 3000
WINDOW = 16


#: Unsolicited pushes at most in the stress test (below the ROUTER's SNDHWM).
MAX_PUSHES = 600


@pytest.mark.parametrize("adapter", adapters())
def test_stress_requests_replies_and_pushes(adapter: AdapterType, pair: Pair) -> None:
    """A client thread keeps WINDOW requests in flight; the reader answers each,
    and a second task sends unsolicited messages whenever it runs (so sends
    race the reader's waits). Every request is answered, in order, and every
    push arrives, in order."""
    result: dict[str, Any] = {}
    peer = pair.peer

    def client() -> None:
        replies: list[int] = []
        pushes: list[int] = []
        sent = 0
        try:
            while True:
                while sent < STRESS and sent - len(replies) < WINDOW:
                    peer.send_multipart([b"req", b"%d" % sent])
                    sent += 1
                kind, n = peer.recv_multipart()  # RCVTIMEO: DEADLINE
                if kind == b"fin":
                    break
                (replies if kind == b"rep" else pushes).append(int(n))
        except zmq.Again:
            result["error"] = f"client timed out after {len(replies)} replies"
        result["replies"], result["pushes"] = replies, pushes

    async def body(a: Adapter) -> None:
        await connected(a, peer)
        done = trio.Event()
        pushed = 0

        async def pusher() -> None:
            # bounded: unsolicited messages to a client that a loaded machine
            # slows down would otherwise pass the ROUTER's high-water mark
            # (1000) and be refused, which is not what this test is about
            nonlocal pushed
            while not done.is_set() and pushed < MAX_PUSHES:
                a.send([IDENTITY, b"push", b"%d" % pushed])
                pushed += 1
                await trio.lowlevel.checkpoint()

        async def reader() -> None:
            for i in range(STRESS):
                frames = await a.recv()
                assert frames == [IDENTITY, b"req", b"%d" % i]
                a.send([IDENTITY, b"rep", b"%d" % i])
            done.set()

        thread = threading.Thread(target=client, name="test-sockets-client")
        thread.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pusher)
                nursery.start_soon(reader)
            a.send([IDENTITY, b"fin", b"0"])  # after every push on the same pipe
        finally:
            await trio.to_thread.run_sync(thread.join)
        result["pushed"] = pushed

    run(adapter, pair.router, body)
    assert "error" not in result, result["error"]
    assert result["replies"] == list(range(STRESS))
    assert result["pushes"] == list(range(result["pushed"]))
    assert result["pushed"] > 0


# ---------------------------------------------------------------- ordering

ORDERED = 2000


@pytest.mark.parametrize("adapter", adapters())
def test_messages_arrive_in_order(adapter: AdapterType, pair: Pair) -> None:
    """Half the messages are queued before the reader starts, half are sent
    while it reads; all are read once, in the order sent."""

    async def body(a: Adapter) -> None:
        await connected(a, pair.peer)
        for i in range(ORDERED // 2):
            pair.peer.send_multipart([b"%d" % i])
        got: list[int] = []

        async def reader() -> None:
            while len(got) < ORDERED:
                _, n = await a.recv()
                got.append(int(n))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            for i in range(ORDERED // 2, ORDERED):
                pair.peer.send_multipart([b"%d" % i])
                await trio.lowlevel.checkpoint()
        assert got == list(range(ORDERED))

    run(adapter, pair.router, body)


# ---------------------------------------------------------------- cancellation


@pytest.mark.parametrize("adapter", adapters(zmq_anyio_fault=FAULT_CANCELLED_WAIT))
def test_cancelled_wait_loses_no_message(adapter: AdapterType, inproc_pair: Pair) -> None:
    """A receive cancelled while it waits (a timeout, a shutdown) takes no
    later message with it."""
    p = inproc_pair

    async def body(a: Adapter) -> None:
        await connected(a, p.peer)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.recv)
                await trio.testing.wait_all_tasks_blocked()  # it waits on ZMQ_FD
                scope.cancel()
        assert scope.cancelled_caught
        p.peer.send_multipart([b"m1"])
        p.peer.send_multipart([b"m2"])
        assert await a.recv() == [IDENTITY, b"m1"]
        assert await a.recv() == [IDENTITY, b"m2"]

    run(adapter, p.router, body)


@pytest.mark.parametrize("adapter", adapters(zmq_anyio_fault=FAULT_CANCELLED_CHECKPOINT))
def test_cancelled_at_checkpoint_drops_nothing(adapter: AdapterType, inproc_pair: Pair) -> None:
    """A receive whose cancel is already pending (a deadline that passed while
    a message was queued) raises Cancelled and leaves the message queued."""
    p = inproc_pair

    async def body(a: Adapter) -> None:
        await connected(a, p.peer)
        p.peer.send_multipart([b"m1"])
        p.peer.send_multipart([b"m2"])
        with trio.CancelScope() as scope:
            scope.cancel()
            await a.recv()
        assert scope.cancelled_caught
        assert await a.recv() == [IDENTITY, b"m1"]
        assert await a.recv() == [IDENTITY, b"m2"]

    run(adapter, p.router, body)


# ---------------------------------------------------------------- fairness

FLOOD = 3000


@pytest.mark.parametrize("adapter", adapters())
def test_flood_does_not_starve_other_tasks(adapter: AdapterType, pair: Pair) -> None:
    """While the reader drains a flood that is already queued (so no receive
    ever waits), another task of the run keeps running: at most a few
    messages are read between two of its turns."""

    async def body(a: Adapter) -> None:
        await connected(a, pair.peer)
        for i in range(FLOOD):
            pair.peer.send_multipart([b"%d" % i])
        read = 0
        turns: list[int] = []  # messages read so far, at each of the other task's turns

        async def reader() -> None:
            nonlocal read
            while read < FLOOD:
                await a.recv()
                read += 1

        async def other() -> None:
            while read < FLOOD:
                turns.append(read)
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(other)
        gaps = [hi - lo for lo, hi in zip([0, *turns], [*turns, FLOOD], strict=True)]
        assert max(gaps) <= 4, f"the reader ran {max(gaps)} messages without letting the other task run"

    run(adapter, pair.router, body)


# ---------------------------------------------------------------- a second client, same identity


@pytest.mark.parametrize("handover", [0, 1], ids=["handover-off", "handover-on"])
@pytest.mark.parametrize("adapter", adapters())
def test_second_client_with_the_same_identity(adapter: AdapterType, pair: Pair, handover: int) -> None:
    """Two clients of one jupyter_client KernelManager share a Session and so
    one DEALER identity (jupyter_client connects shell, control and stdin with
    ``identity=session.bsession``). What libzmq's ROUTER then does, the same
    with either adapter (documented in docs/design.md, "Sockets"):

    - ROUTER_HANDOVER off (libzmq's and trikernel's default):
      the second client's requests are never read and it gets no reply; the
      first client is served as before.
    - ROUTER_HANDOVER on (ipykernel's, on shell, control and stdin):
      the second client takes the route over: its
      requests are read and replies to the shared identity reach it; the
      first client's later requests are never read and it gets no reply.

    Either way one of the two clients is cut off: it is the shared identity,
    not the socket driver."""
    pair.router.setsockopt(zmq.ROUTER_HANDOVER, handover)
    first = pair.peer

    async def body(a: Adapter) -> None:
        await connected(a, first)
        a.send([IDENTITY, b"reply-1"])
        assert first.recv_multipart() == [b"reply-1"]
        second = pair.dealer(IDENTITY)  # connects once the first client is known
        second.send_multipart([b"from-second"])
        if handover:
            served, cut_off = second, first
            assert await a.recv() == [IDENTITY, b"from-second"]
        else:
            served, cut_off = first, second
        cut_off.send_multipart([b"from-cut-off"])
        served.send_multipart([b"from-served"])  # sent after the cut-off client's request
        assert await a.recv() == [IDENTITY, b"from-served"]
        a.send([IDENTITY, b"reply-2"])
        assert served.recv_multipart() == [b"reply-2"]
        # bounded waits for what must not come
        with trio.move_on_after(ABSENCE) as scope:
            frames = await a.recv()
            pytest.fail(f"handover={handover}: the cut-off client's request was read: {frames}")
        assert scope.cancelled_caught
        assert not cut_off.poll(int(ABSENCE * 1000)), f"handover={handover}: the cut-off client got a reply"

    run(adapter, pair.router, body)
