"""Tier 2: IOPubQueue + IOPubTask on real ZeroMQ sockets, in-process.

A real XPUB bound on loopback (options set before bind, as sockets.py does)
and real SUB subscribers in the same process; the publisher runs in a trio
run in the test thread, producers are the test thread (before the run
starts), threads (``IOPubQueue.put_from_thread``/``write_stream``) or io-run tasks
(``send``). No kernel subprocess, no IPython.

Covered: stream coalescing and what seals a batch (other message, other
stream, new parent, size), FIFO order across producers, backpressure
(producers block at ``capacity``; coalescing needs no credit), ``close``
drains, NODROP waits for a slow subscriber without loss, a stuck subscriber
falls back after ``send_timeout`` while a live one gets everything, one
``iopub_welcome`` per subscriber, a new subscriber joining must not cost
a slow (not stuck) subscriber any message, and what is published while no
one is subscribed is held (bounded) for the next subscriber.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
import warnings
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import trio
import zmq

from trikernel.protocol.messages import MessageBuilder as Session
from trikernel.protocol.wire import Message, Signer, deserialize
from trikernel.server.iopubqueue import IO_OVERDRAFT, IOPubQueue, IOPubStats
from trikernel.server.iopubtask import IOPubTask
from trikernel.server.subscribers import iopub_maxmsgsize

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

pytestmark = pytest.mark.timeout(60)

KEY = b"tier2-key"


@dataclass
class Rig:
    """One XPUB, its queue and publisher, and helpers to make subscribers."""

    ctx: zmq.Context
    xpub: zmq.Socket
    url: str
    queue: IOPubQueue
    publisher: IOPubTask
    session: Session
    signer: Signer
    stats: IOPubStats
    subs: list[zmq.Socket] = field(default_factory=list)

    def msg(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None = None) -> Message:
        return self.session.iopub(msg_type, content, parent)

    def display(self, i: int, parent: dict[str, Any] | None = None, pad: int = 0) -> Message:
        return self.msg(
            "display_data", {"data": {"text/plain": str(i) + " " * pad}, "metadata": {}, "transient": {}}, parent
        )

    def subscriber(self, *, rcvhwm: int | None = None, rcvbuf: int | None = None) -> zmq.Socket:
        s = self.ctx.socket(zmq.SUB)
        s.linger = 0
        if rcvhwm is not None:
            s.rcvhwm = rcvhwm
        if rcvbuf is not None:
            s.rcvbuf = rcvbuf
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(self.url)
        self.subs.append(s)
        return s

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        """Before the publisher runs: wait until a subscription reached the
        XPUB (poll does not consume it; the publisher welcomes it first)."""
        assert self.xpub.poll(int(timeout * 1000), zmq.POLLIN), "subscription never arrived"

    def close(self) -> None:
        """As the kernel's BoundSockets.close: libzmq's end of the monitor first
        (a monitor torn down under a live XPUB can assert in libzmq while the
        context terminates: libzmq#2083), then every socket at LINGER 0, then
        the context, so that nothing it still owns keeps term() waiting."""
        if self.publisher.subscribers.monitor is not None and not self.xpub.closed:
            self.xpub.disable_monitor()
        for s in self.subs:
            s.close(linger=0)
        self.xpub.close(linger=0)
        if self.publisher.subscribers.monitor is not None:
            self.publisher.subscribers.monitor.close(linger=0)
        self.ctx.destroy(linger=0)


def make_rig(
    *,
    capacity: int = 1000,
    stream_batch_chars: int = 1 << 16,
    sndhwm: int = 1000,
    send_timeout: float = 10.0,
    warn_after: float = 1.0,
    sndbuf: int | None = None,
    hold_bytes: int = 0,
    monitor: bool = False,
) -> Rig:
    ctx = zmq.Context()
    x = ctx.socket(zmq.XPUB)
    # before bind, like sockets.create_and_bind
    x.sndhwm = sndhwm
    x.setsockopt(zmq.XPUB_NODROP, 1)
    x.setsockopt(zmq.XPUB_VERBOSE, 1)
    x.setsockopt(zmq.MAXMSGSIZE, iopub_maxmsgsize(1024))  # the kernel's default (sockopts.DEFAULTS)
    x.linger = 0
    if sndbuf is not None:  # small OS buffer: a non-reading subscriber fills up after few messages
        x.sndbuf = sndbuf
    # the kernel's monitor, attached before bind as sockets.create_and_bind does
    mon = x.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED) if monitor else None
    port = x.bind_to_random_port("tcp://127.0.0.1")
    stats = IOPubStats()
    signer = Signer(KEY)
    q = IOPubQueue(capacity, stream_batch_chars, stats, signer)
    session = Session()
    pub = IOPubTask(x, q, session, send_timeout=send_timeout, warn_after=warn_after, hold_bytes=hold_bytes, monitor=mon)
    return Rig(ctx, x, f"tcp://127.0.0.1:{port}", q, pub, session, signer, stats)


@pytest.fixture
def rig_factory() -> Any:
    rigs: list[Rig] = []

    def factory(**kw: Any) -> Rig:
        r = make_rig(**kw)
        rigs.append(r)
        return r

    yield factory
    for r in rigs:  # every rig, even after one failed to close
        try:
            r.close()
        except Exception as exc:
            warnings.warn(f"a test rig did not close cleanly: {exc!r}", stacklevel=1)


class Reader:
    """Decodes everything a SUB receives (a fresh verifier per reader: the
    replay guard is per connection)."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.signer = Signer(KEY)
        self.msgs: list[Message] = []

    def poll_once(self) -> bool:
        try:
            frames = self.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.msgs.append(deserialize(frames, self.signer))
        return True

    async def read_until(
        self,
        pred: Callable[[list[Message]], bool],
        timeout: float,  # noqa: ASYNC109 - the deadline is part of the assertion it makes
    ) -> None:
        with trio.move_on_after(timeout):
            while not pred(self.msgs):
                if not self.poll_once():
                    await trio.sleep(0.001)
        assert pred(self.msgs), f"timed out after {timeout}s with {len(self.msgs)} messages"

    async def read_for(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            while True:
                if not self.poll_once():
                    await trio.sleep(0.001)

    def non_welcome(self) -> list[Message]:
        return [m for m in self.msgs if m.msg_type != "iopub_welcome"]

    def welcomes(self) -> list[Message]:
        return [m for m in self.msgs if m.msg_type == "iopub_welcome"]


@asynccontextmanager
async def running(rig: Rig) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        await n.start(rig.publisher.run)
        yield n
        n.cancel_scope.cancel()


@asynccontextmanager
async def welcomed(rig: Rig, sub: zmq.Socket) -> AsyncIterator[tuple[Reader, trio.Nursery]]:
    """The publisher running, and a Reader of ``sub`` past its welcome."""
    r = Reader(sub)
    async with running(rig) as nursery:
        await r.read_until(lambda m: len(r.welcomes()) >= 1, 5)
        yield r, nursery


def count_is(n: int) -> Callable[[list[Message]], bool]:
    return lambda msgs: sum(m.msg_type != "iopub_welcome" for m in msgs) >= n


def streams(msgs: list[Message]) -> list[tuple[str, str, str]]:
    return [
        (m.content["name"], m.content["text"], m.parent_header.get("msg_id", ""))
        for m in msgs
        if m.msg_type == "stream"
    ]


# --------------------------------------------------------------------------- coalescing


def test_coalescing_and_what_seals_a_batch(rig_factory: Any) -> None:
    rig = rig_factory()
    sub = rig.subscriber()
    rig.wait_subscribed()
    q = rig.queue
    p1, p2 = {"msg_id": "p1"}, {"msg_id": "p2"}
    # queued before the publisher runs: nothing leaves yet, batches stay open
    q.write_stream("stdout", "a", p1)
    q.write_stream("stdout", "b", p1)  # same stream, same parent: coalesced
    q.put_from_thread(rig.display(1, p1))  # any other message seals
    q.write_stream("stdout", "c", p1)
    q.write_stream("stderr", "d", p1)  # another stream seals stdout
    q.write_stream("stdout", "e", p1)
    q.write_stream("stdout", "f", p2)  # new parent seals
    q.write_stream("stdout", "g", p2)
    q.put_from_thread(rig.msg("status", {"execution_state": "idle"}, p2))

    async def main() -> None:
        r = Reader(sub)
        async with running(rig):
            await r.read_until(lambda m: any(x.msg_type == "status" for x in m), 5)
        got = r.non_welcome()
        assert [m.msg_type for m in got] == ["stream", "display_data", "stream", "stream", "stream", "stream", "status"]
        assert streams(got) == [
            ("stdout", "ab", "p1"),
            ("stdout", "c", "p1"),
            ("stderr", "d", "p1"),
            ("stdout", "e", "p1"),
            ("stdout", "fg", "p2"),
        ]
        assert rig.stats.stream_writes == 7
        assert rig.stats.stream_messages == 5

    trio.run(main)


def test_batch_sealed_by_size_text_intact(rig_factory: Any) -> None:
    rig = rig_factory(stream_batch_chars=1024)
    sub = rig.subscriber()
    rig.wait_subscribed()
    parts = [f"{i:04d}" + "x" * 95 + "\n" for i in range(100)]  # 100 chars each
    for p in parts:
        rig.queue.write_stream("stdout", p, {"msg_id": "p"})
    rig.queue.put_from_thread(rig.msg("status", {"execution_state": "idle"}))

    async def main() -> None:
        r = Reader(sub)
        async with running(rig):
            await r.read_until(lambda m: any(x.msg_type == "status" for x in m), 5)
        texts = [t for _, t, _ in streams(r.non_welcome())]
        assert "".join(texts) == "".join(parts)
        # sealed once a batch reached 1024 chars: 11 writes of 100 per batch
        assert all(len(t) <= 1024 + 100 for t in texts), [len(t) for t in texts]
        assert 9 <= len(texts) <= 11, len(texts)

    trio.run(main)


def test_thread_flood_is_coalesced_in_order(rig_factory: Any) -> None:
    rig = rig_factory()
    sub = rig.subscriber()
    n_lines = 200_000
    expected = "".join(f"{i}\n" for i in range(n_lines))

    def flood() -> None:
        for i in range(n_lines):
            rig.queue.write_stream("stdout", f"{i}", {"msg_id": "p"})
            rig.queue.write_stream("stdout", "\n", {"msg_id": "p"})
        rig.queue.put_from_thread(rig.msg("status", {"execution_state": "idle"}))

    async def main() -> None:
        async with welcomed(rig, sub) as (r, n):
            n.start_soon(trio.to_thread.run_sync, flood)
            await r.read_until(lambda m: any(x.msg_type == "status" for x in m), 30)
        texts = [t for _, t, _ in streams(r.non_welcome())]
        assert "".join(texts) == expected
        assert len(texts) < n_lines * 2 / 100, f"{len(texts)} stream messages for {2 * n_lines} writes"
        assert rig.stats.stream_writes == 2 * n_lines

    trio.run(main)


def test_first_write_leaves_promptly(rig_factory: Any) -> None:
    rig = rig_factory()
    sub = rig.subscriber()

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            await trio.to_thread.run_sync(
                lambda: (rig.queue.write_stream("stdout", "hello", {}), rig.queue.write_stream("stdout", "\n", {}))
            )
            # nothing else is queued to seal it: it leaves by itself (held only FIRST_WRITE_DELAY)
            await r.read_until(lambda m: bool(streams(m)), 30)
        assert streams(r.msgs) == [("stdout", "hello\n", "")]  # text + newline: one message

    trio.run(main)


def test_sealing_ends_the_hold_on_an_open_stream_batch(rig_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The iopub task holds an open tail batch for more text; a message that
    seals it (here from another thread, as a display after a print) ends
    the hold at once instead of after it (issue 12: an idle or a result
    right after a print). With a 30 s hold, only the seal can make it leave."""
    import trikernel.server.iopubtask as iopub_mod

    monkeypatch.setattr(iopub_mod, "FIRST_WRITE_DELAY", 30.0)
    rig = rig_factory()
    sub = rig.subscriber()

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            await trio.to_thread.run_sync(lambda: rig.queue.write_stream("stdout", "line\n", {}))
            await trio.sleep(0.2)  # the task now holds the open batch (it waits 30 s for more text)
            assert not streams(r.msgs)
            await trio.to_thread.run_sync(lambda: rig.queue.put_from_thread(rig.display(1)))
            await r.read_until(count_is(2), 10)
        assert [m.msg_type for m in r.non_welcome()] == ["stream", "display_data"]

    trio.run(main)


def test_an_unfinished_line_waits_for_its_newline_or_a_flush(rig_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that ends mid-line is held for the rest of the line (PARTIAL_LINE_HOLD), so
    print's text and late newline are one message; flush() lets it go at once (one message
    per ``print(i, end="", flush=True)``, as ipykernel's own tests count). With a 30 s hold,
    only the newline or the flush can make the text leave."""
    import trikernel.server.iopubtask as iopub_mod

    monkeypatch.setattr(iopub_mod, "PARTIAL_LINE_HOLD", 30.0)
    rig = rig_factory()
    sub = rig.subscriber()

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            await trio.to_thread.run_sync(lambda: rig.queue.write_stream("stdout", "Hello World", {}))
            await trio.sleep(0.2)  # past FIRST_WRITE_DELAY: the task holds it for the newline
            assert not streams(r.msgs)
            await trio.to_thread.run_sync(lambda: rig.queue.write_stream("stdout", "\n", {}))
            await r.read_until(lambda m: bool(streams(m)), 10)
            await trio.to_thread.run_sync(lambda: rig.queue.write_stream("stdout", "0", {}))
            await trio.sleep(0.2)
            assert len(streams(r.msgs)) == 1
            await trio.to_thread.run_sync(lambda: rig.queue.flush_stream("stdout"))
            await r.read_until(lambda m: len(streams(m)) == 2, 10)
        assert streams(r.msgs) == [("stdout", "Hello World\n", ""), ("stdout", "0", "")]

    trio.run(main)


def test_a_lone_message_after_a_pause_is_not_held_back(rig_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adaptive batching: the gather window applies inside a burst only. With
    a 30 s window, a lone message from another thread after a pause must
    still leave at once."""
    import trikernel.server.iopubqueue as iopub_mod

    monkeypatch.setattr(iopub_mod, "GATHER_WINDOW", 30.0)
    rig = rig_factory()
    sub = rig.subscriber()

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            await trio.sleep(0.1)  # a pause longer than BURST_GAP
            await trio.to_thread.run_sync(lambda: rig.queue.put_from_thread(rig.display(7)))
            await r.read_until(count_is(1), 10)
        assert [m.content["data"]["text/plain"] for m in r.non_welcome()] == ["7"]

    trio.run(main)


# --------------------------------------------------------------------------- order, backpressure, close


def test_fifo_across_thread_producers(rig_factory: Any) -> None:
    rig = rig_factory(capacity=50)
    sub = rig.subscriber()
    n_threads, per = 4, 500

    def produce(t: int) -> None:
        for i in range(per):
            rig.queue.put_from_thread(
                rig.msg("display_data", {"data": {"text/plain": f"{t}:{i}"}, "metadata": {}, "transient": {}}),
            )
            if i % 50 == 0:
                rig.queue.write_stream("stdout", f"{t}:{i}\n", {"msg_id": f"t{t}"})

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            async with trio.open_nursery() as n:
                for t in range(n_threads):
                    n.start_soon(trio.to_thread.run_sync, produce, t)
            await r.read_until(lambda m: sum(x.msg_type == "display_data" for x in m) >= n_threads * per, 30)
            await r.read_for(0.1)
        seen: dict[str, list[int]] = {str(t): [] for t in range(n_threads)}
        for m in r.non_welcome():
            text = m.content["data"]["text/plain"] if m.msg_type == "display_data" else None
            if text is not None:
                t, i = text.split(":")
                seen[t].append(int(i))
        assert all(v == list(range(per)) for v in seen.values())
        # each thread's stream text arrives complete and in its order
        for t in range(n_threads):
            text = "".join(x for name, x, pid in streams(r.msgs) if pid == f"t{t}")
            assert text == "".join(f"{t}:{i}\n" for i in range(0, per, 50))
        assert rig.stats.producer_blocks > 0  # capacity 50 was reached

    trio.run(main)


def test_backpressure_blocks_producers_at_capacity(rig_factory: Any) -> None:
    cap = 5
    rig = rig_factory(capacity=cap)
    sub = rig.subscriber()
    rig.wait_subscribed()
    done = threading.Event()
    progress: list[int] = []

    def produce() -> None:
        for i in range(cap + 3):
            rig.queue.put_from_thread(rig.display(i))
            progress.append(i)
        done.set()

    th = threading.Thread(target=produce, daemon=True)
    th.start()  # the publisher is not running: nobody takes messages out
    time.sleep(0.5)
    assert not done.is_set()
    assert progress == list(range(cap))
    assert len(rig.queue) == cap
    assert rig.stats.producer_blocks == 1

    # an open stream batch still takes text without a credit (no block)
    rig2 = rig_factory(capacity=1)
    rig2.queue.write_stream("stdout", "a", {})
    for _ in range(1000):  # with no credit left, a write that needed one would block here for good
        rig2.queue.write_stream("stdout", "b", {})
    assert len(rig2.queue) == 1

    async def main() -> None:
        r = Reader(sub)
        async with running(rig):
            await trio.to_thread.run_sync(done.wait, 10)
            await r.read_until(count_is(cap + 3), 5)
        assert [m.content["data"]["text/plain"] for m in r.non_welcome()] == [str(i) for i in range(cap + 3)]

    trio.run(main)
    th.join(5)


def test_send_waits_for_credit_in_io_run(rig_factory: Any) -> None:
    rig = rig_factory(capacity=2)
    sub = rig.subscriber()
    rig.wait_subscribed()

    async def main() -> None:
        r = Reader(sub)
        finished: list[int] = []

        total = 2 + IO_OVERDRAFT + 4

        async def producer() -> None:
            for i in range(total):
                await rig.queue.put(rig.display(i))
                finished.append(i)

        async with trio.open_nursery() as n:
            n.start_soon(producer)
            await trio.sleep(0.3)
            # capacity, plus the io run's bounded overdraft, then it blocks: no consumer yet
            assert finished == list(range(2 + IO_OVERDRAFT))
            await n.start(rig.publisher.run)
            await r.read_until(count_is(total), 5)
            n.cancel_scope.cancel()
        assert finished == list(range(total))
        assert [m.content["data"]["text/plain"] for m in r.non_welcome()] == [str(i) for i in range(total)]

    trio.run(main)


def test_close_drains_then_run_returns(rig_factory: Any) -> None:
    rig = rig_factory(capacity=1000)
    sub = rig.subscriber()
    rig.wait_subscribed()
    for i in range(500):
        rig.queue.put_from_thread(rig.display(i))
    rig.queue.write_stream("stdout", "tail", {})
    rig.queue.close()

    async def main() -> None:
        with trio.fail_after(10):
            await rig.publisher.run()  # returns by itself after the close marker
        r = Reader(sub)
        await r.read_until(lambda m: bool(streams(m)), 5)
        got = r.non_welcome()
        assert [m.content["data"]["text/plain"] for m in got[:-1]] == [str(i) for i in range(500)]
        assert streams(got) == [("stdout", "tail", "")]
        assert rig.stats.sent == 501  # welcomes are counted apart, in `welcomes`

    trio.run(main)


# --------------------------------------------------------------------------- NODROP, timeout, fallback


def test_nodrop_waits_for_slow_subscriber_without_loss(rig_factory: Any) -> None:
    rig = rig_factory(capacity=100, sndhwm=20, send_timeout=30, warn_after=30, sndbuf=4096)
    sub = rig.subscriber(rcvhwm=1, rcvbuf=4096)
    n = 2000

    async def main() -> None:
        async with welcomed(rig, sub) as (r, nursery):

            async def produce() -> None:
                for i in range(n):
                    await rig.queue.put(rig.display(i, pad=1000))

            nursery.start_soon(produce)
            await trio.sleep(1.5)  # subscriber not reading: its pipe fills, sends wait
            assert rig.stats.waits > 0
            assert rig.stats.sent < n
            await r.read_until(count_is(n), 20)
        assert [int(m.content["data"]["text/plain"]) for m in r.non_welcome()] == list(range(n))
        assert rig.stats.fallback_drops == 0

    trio.run(main)


@pytest.mark.timeout(300)  # a hang bound above read_until's own (120 s): 4 s idle, past 60 s at load 20
def test_stuck_subscriber_falls_back_live_one_gets_all(rig_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trikernel.iopub")
    # SNDHWM 500: the live reader (this same trio run) may fall that far behind
    # on a loaded machine before a lossy send would skip it too; the stuck one
    # fills it (small OS buffers) and is cut off
    rig = rig_factory(capacity=100, sndhwm=500, send_timeout=0.5, warn_after=0.2, sndbuf=4096)
    live = rig.subscriber()
    stuck = rig.subscriber(rcvhwm=1, rcvbuf=4096)
    n = 5000

    async def main() -> None:
        rl = Reader(live)
        async with running(rig) as nursery:
            await rl.read_until(lambda m: len(rl.welcomes()) >= 2, 5)  # both subscribed
            assert stuck.poll(2000)  # stuck has its welcome queued; it never reads it

            async def produce() -> None:
                for i in range(n):
                    await rig.queue.put(rig.display(i, pad=500))

            nursery.start_soon(produce)
            await rl.read_until(count_is(n), 120)  # bounds a hang; no wall-clock claim (issue 26)
        assert [int(m.content["data"]["text/plain"]) for m in rl.non_welcome()] == list(range(n))
        assert rig.stats.fallback_drops >= 1
        assert rig.stats.waits >= 1
        text = caplog.text
        assert "a subscriber is not reading" in text
        assert "stalled past the 0.5s send timeout" in text

    trio.run(main)
    got = 0
    while stuck.poll(200):
        stuck.recv_multipart()
        got += 1
    assert got < n  # it really was stuck and lost messages


def test_every_subscriber_gets_a_welcome(rig_factory: Any) -> None:
    rig = rig_factory()

    async def main() -> None:
        async with running(rig):
            readers = []
            for _ in range(3):
                r = Reader(rig.subscriber())
                readers.append(r)
                await r.read_until(lambda m, r=r: len(r.welcomes()) >= 1, 5)
            await trio.sleep(0.1)
            for r in readers:
                r.poll_once()
        assert rig.stats.welcomes == 3
        for r in readers:
            assert r.welcomes()[0].content == {"subscription": ""}

    trio.run(main)


def test_new_subscriber_does_not_cost_a_slow_subscriber_messages(rig_factory: Any) -> None:
    """A subscriber that is behind (pipe full, well within send_timeout) must
    lose nothing when another subscriber joins.

    Fails while welcomes are sent with NODROP off (iopub.py
    ``_handle_subscriptions`` -> ``_lossy``): the lossy write fails on the
    full pipe, libzmq's dist_t then deactivates that pipe, and the slow
    subscriber silently misses every message until it has drained to the
    pipe's low-water mark; nothing is counted or logged.
    """
    rig = rig_factory(capacity=100, sndhwm=20, send_timeout=30, warn_after=30)
    slow = rig.subscriber(rcvhwm=1, rcvbuf=4096)
    n = 3000

    async def main() -> None:
        rs = Reader(slow)
        async with running(rig) as nursery:
            await rs.read_until(lambda m: len(rs.welcomes()) >= 1, 5)

            async def produce() -> None:
                for i in range(n):
                    await rig.queue.put(rig.display(i, pad=1000))

            nursery.start_soon(produce)
            await trio.sleep(1.0)
            assert rig.stats.waits > 0  # slow's pipe is full; the publisher waits for it
            joiner = Reader(rig.subscriber())
            # the slow subscriber keeps reading (slowly) while the joiner waits:
            # its welcome goes out once the slow pipe has room, like any message
            with trio.fail_after(35):
                while len(joiner.welcomes()) < 1:
                    if not (rs.poll_once() | joiner.poll_once()):
                        await trio.sleep(0.001)

            def last_seen() -> bool:
                tail = rs.msgs[-3:]
                return any(m.content.get("data", {}).get("text/plain", "").split(" ")[0] == str(n - 1) for m in tail)

            with trio.fail_after(300):  # a hang, not a speed: a loaded machine reads the tail late
                while not last_seen():
                    if not rs.poll_once():
                        await trio.sleep(0.001)
                    joiner.poll_once()
        got = [int(m.content["data"]["text/plain"]) for m in rs.non_welcome()]
        missing = n - len(got)
        assert got == list(range(n)), f"slow subscriber lost {missing} of {n} messages when another subscriber joined"
        assert rig.stats.fallback_drops == 0

    trio.run(main)


# ------------------------------------------------------------- no subscriber: hold


async def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:  # noqa: ASYNC109 - part of the assertion
    with trio.move_on_after(timeout):
        while not pred():  # noqa: ASYNC110 - polls counters of the task under test; no event to wait on
            await trio.sleep(0.001)
    assert pred(), f"not within {timeout}s"


def test_what_is_published_before_the_first_subscriber_reaches_it(rig_factory: Any) -> None:
    """jupyter console's start (jupyter_client#593): the SUB socket joins after
    the first cell's busy, output and idle were published. They are held, and
    the subscriber gets them, in order, right after its welcome."""
    rig = rig_factory(hold_bytes=1 << 20)

    async def main() -> None:
        async with running(rig):
            assert rig.publisher.holding
            for i in range(50):
                await rig.queue.put(rig.display(i))
            rig.queue.write_stream("stdout", "42\n", {"msg_id": "p"})
            await rig.queue.put(rig.msg("status", {"execution_state": "idle"}))
            await _until(lambda: rig.stats.held == 52)
            assert rig.stats.sent == 0
            r = Reader(rig.subscriber())
            await r.read_until(count_is(52), 5)
            await r.read_for(0.05)  # nothing more comes
            assert r.msgs[0].msg_type == "iopub_welcome"
            got = r.non_welcome()
            assert [m.content["data"]["text/plain"] for m in got[:50]] == [str(i) for i in range(50)]
            assert streams(got[50:51]) == [("stdout", "42\n", "p")]
            assert [m.msg_type for m in got[51:]] == ["status"]
            # and from now on nothing is held
            await rig.queue.put(rig.display(99))
            await r.read_until(count_is(53), 5)
            assert (rig.stats.held, rig.stats.hold_drops, rig.stats.sent) == (52, 0, 53)

    trio.run(main)


def test_the_hold_is_bounded_and_drops_oldest_first(rig_factory: Any) -> None:
    rig = rig_factory(hold_bytes=16 << 10)

    async def main() -> None:
        async with running(rig):
            for i in range(200):
                await rig.queue.put(rig.display(i, pad=500))
            await _until(lambda: rig.stats.held == 200)
            assert 0 < rig.stats.hold_drops < 200
            kept = 200 - rig.stats.hold_drops
            r = Reader(rig.subscriber())
            await r.read_until(count_is(kept), 5)
            await r.read_for(0.05)
            got = [int(m.content["data"]["text/plain"]) for m in r.non_welcome()]
            assert got == list(range(200 - kept, 200))  # the newest, in order
            assert 14 <= kept <= 24  # 16 KiB of signed messages of 0.7-1.1 KiB

    trio.run(main)


def test_without_a_monitor_only_the_first_subscriber_is_held_for(rig_factory: Any) -> None:
    """The hold ends with the first subscription, and an unsubscription cannot
    say that nobody is left (see the stray-unsubscription test): without the
    XPUB's monitor the task then sends as a PUB socket does, and what is sent
    while nobody is subscribed is lost."""
    rig = rig_factory(hold_bytes=1 << 20)

    async def main() -> None:
        async with running(rig):
            first = rig.subscriber()
            r1 = Reader(first)
            await r1.read_until(lambda m: len(r1.welcomes()) == 1, 5)
            assert not rig.publisher.holding
            await rig.queue.put(rig.display(1))
            await r1.read_until(count_is(1), 5)
            first.close(linger=0)
            rig.subs.remove(first)
            await rig.queue.put(rig.display(2))
            await _until(lambda: rig.stats.sent == 2)
            r2 = Reader(rig.subscriber())
            await r2.read_until(lambda m: len(r2.welcomes()) == 1, 5)
            await r2.read_for(0.05)
            assert r2.non_welcome() == []
            assert (rig.stats.held, rig.stats.hold_drops) == (0, 0)

    trio.run(main)


def test_nothing_is_held_with_hold_bytes_zero(rig_factory: Any) -> None:
    """``--iopub-hold-bytes 0``: a plain PUB socket's behaviour. The message is
    sent (libzmq drops it: nobody is subscribed), not held and dropped by the
    kernel: a subscription libzmq applied but the task has not read yet must
    still get it, as with a plain PUB socket, and nothing is logged."""
    rig = rig_factory(hold_bytes=0)

    async def main() -> None:
        async with running(rig):
            await rig.queue.put(rig.display(1))
            await _until(lambda: rig.stats.sent == 1)
            r = Reader(rig.subscriber())
            await r.read_until(lambda m: len(m) >= 1, 5)
            await r.read_for(0.05)
            assert [m.msg_type for m in r.msgs] == ["iopub_welcome"]
            assert (rig.stats.held, rig.stats.hold_drops) == (0, 0)

    trio.run(main)


def test_a_message_larger_than_the_hold_is_dropped_alone(rig_factory: Any) -> None:
    """Regression (review): one message larger than ``hold_bytes`` made _hold
    drop every older held message, and then itself; the next subscriber got
    nothing. It is dropped alone: the older ones still fit."""
    rig = rig_factory(hold_bytes=4000)

    async def main() -> None:
        async with running(rig):
            for i in range(3):
                await rig.queue.put(rig.display(i))
            await rig.queue.put(rig.display(99, pad=10_000))
            await rig.queue.put(rig.display(3))
            await _until(lambda: rig.stats.held == 5)
            assert rig.stats.hold_drops == 1
            r = Reader(rig.subscriber())
            await r.read_until(count_is(4), 5)
            await r.read_for(0.05)
            assert [m.content["data"]["text/plain"] for m in r.non_welcome()] == ["0", "1", "2", "3"]

    trio.run(main)


def _raw_sub(url: str, frames: list[bytes]) -> socket.socket:
    """A ZMTP 3.0 SUB peer written by hand (RFC 23/ZMTP, NULL mechanism) that
    sends ``frames`` as messages: libzmq's own SUB and XSUB never send an
    unsubscription for a topic they have not subscribed to, other peers may."""
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    t = socket.create_connection((host, int(port)), timeout=5)
    t.sendall(b"\xff" + b"\0" * 8 + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + b"\0" * 31)
    t.recv(64)
    body = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
    t.sendall(b"\x04" + bytes([len(body)]) + body)
    for f in frames:
        t.sendall(b"\x00" + bytes([len(f)]) + f)
    return t


def test_a_stray_unsubscription_does_not_silence_a_live_subscriber(rig_factory: Any) -> None:
    """Found in review: libzmq reports an unsubscription for a topic the
    sending peer never subscribed to (mtrie rm -> not_found notifies), even
    while another peer is subscribed to it. Any peer that can connect to the
    IOPub port (no auth on subscriptions) then made the task's set of
    subscribed topics empty: it held everything, and the live subscriber got
    nothing until some new subscription arrived. Unsubscriptions are now
    ignored (the hold ends with the first subscription)."""
    rig = rig_factory(hold_bytes=1 << 20)

    async def main() -> None:
        async with running(rig):
            r = Reader(rig.subscriber())
            await r.read_until(lambda m: len(m) >= 1, 5)  # its welcome
            stray = _raw_sub(rig.url, [b"\x00"])  # unsubscribes from b"" without a subscription
            try:
                await trio.sleep(0.3)
                await rig.queue.put(rig.display(1))
                await r.read_until(count_is(1), 3)
            finally:
                stray.close()

    trio.run(main)


@pytest.mark.parametrize("how", ["one subscriber", "two subscribers", "one socket subscribed twice"])
def test_with_no_connection_left_the_next_subscriber_gets_what_came_between(rig_factory: Any, how: str) -> None:
    """With the monitor (as in the kernel): when the last connection is gone
    the hold starts again, so a client that subscribes later (jupyter console
    --existing on a kernel nobody watches) gets what came in between; two
    subscribers (jupyter_server's activity watcher and a websocket's SUB) or
    one that subscribed twice leave with one unsubscription, and only the
    connection count says when nobody is left."""
    rig = rig_factory(hold_bytes=1 << 20, monitor=True)

    async def main() -> None:
        async with running(rig):
            subs = [rig.subscriber()] + ([rig.subscriber()] if how == "two subscribers" else [])
            if how == "one socket subscribed twice":
                subs[0].setsockopt(zmq.SUBSCRIBE, b"")
            r = Reader(subs[0])
            subscriptions = 1 if how == "one subscriber" else 2
            await r.read_until(lambda m: len(r.welcomes()) == subscriptions, 5)  # one welcome per subscription
            await _until(lambda: not rig.publisher.holding and rig.publisher.connections == len(subs))
            await rig.queue.put(rig.display(1))
            await r.read_until(count_is(1), 5)
            subs[0].close(linger=0)
            rig.subs.remove(subs[0])
            if len(subs) == 2:  # one connection is left: nothing is held
                await _until(lambda: rig.publisher.connections == 1)
                assert not rig.publisher.holding
                subs[1].close(linger=0)
                rig.subs.remove(subs[1])
            await _until(lambda: rig.publisher.holding)  # no connection left
            await rig.queue.put(rig.display(2))
            await _until(lambda: rig.stats.held == 1)
            r3 = Reader(rig.subscriber())
            await r3.read_until(count_is(1), 5)
            assert r3.msgs[0].msg_type == "iopub_welcome"
            assert [m.content["data"]["text/plain"] for m in r3.non_welcome()] == ["2"]
            await _until(lambda: not rig.publisher.holding)

    trio.run(main)


def test_with_the_monitor_a_stray_unsubscription_does_not_start_the_hold(rig_factory: Any) -> None:
    """The stray unsubscription again, with the monitor: the live
    subscriber's connection is counted, so nothing is held for it."""
    rig = rig_factory(hold_bytes=1 << 20, monitor=True)

    async def main() -> None:
        async with running(rig):
            r = Reader(rig.subscriber())
            await r.read_until(lambda m: len(m) >= 1, 5)
            stray = _raw_sub(rig.url, [b"\x00"])
            try:
                # while the stray peer is there (libzmq may also drop it at once:
                # the count is not waited on), and after it has left
                await rig.queue.put(rig.display(1))
                await r.read_until(count_is(1), 3)
                stray.close()
                await _until(lambda: rig.publisher.connections == 1)  # only the live subscriber
                assert not rig.publisher.holding
                await rig.queue.put(rig.display(2))
                await r.read_until(count_is(2), 3)
            finally:
                stray.close()

    trio.run(main)


def test_a_subscription_read_after_its_connection_left_does_not_end_the_hold(rig_factory: Any) -> None:
    """A peer that subscribes and closes at once: libzmq still hands the XPUB
    its subscription, and the io run may read it after the connection's
    DISCONNECTED. It used to end the hold with no connection left (about 8
    times in 20 here), and nothing restarted it until another connection came
    and went: the next client lost what came in between."""
    rig = rig_factory(hold_bytes=1 << 20, monitor=True)

    async def main() -> None:
        async with running(rig):
            for i in range(20):
                t = _raw_sub(rig.url, [b"\x01"])
                t.settimeout(0.1)  # read what the kernel sent, so that the close is a FIN, not an RST
                with contextlib.suppress(OSError):
                    while t.recv(4096):
                        pass
                t.close()
                await _until(lambda: rig.publisher.connections == 0)
                # A peer that closes during its handshake may never have its
                # subscription handed over; one that was is read by now.
                await trio.sleep(0.05)
                assert rig.publisher.holding, f"connection {i}"
            assert rig.stats.welcomes >= 1  # the case happened: a subscription of a peer that had left was read
            await rig.queue.put(rig.display(1))
            await _until(lambda: rig.stats.held == 1)
            r = Reader(rig.subscriber())
            await r.read_until(count_is(1), 5)
            assert [m.content["data"]["text/plain"] for m in r.non_welcome()] == ["1"]

    trio.run(main)


# --------------------------------------------------------------------------- order across channels (issue 26)


def test_an_ordered_send_runs_after_everything_queued_ahead_of_it(rig_factory: Any) -> None:
    """IOPubQueue.put_ordered: the send (a reply, an input_request) runs in the
    io run once every message queued before it went to the XPUB, the open
    stream batch ahead of it included (sealed at once, not held for its 1 ms)."""
    rig = rig_factory()
    sub = rig.subscriber()
    ran: list[tuple[int, bool]] = []

    async def main() -> None:
        done = trio.Event()

        def send() -> None:
            ran.append((rig.stats.sent, rig.queue.in_io_thread))
            done.set()

        async with welcomed(rig, sub) as (r, _):

            def produce() -> bool:
                for i in range(3):
                    rig.queue.put_from_thread(rig.display(i))
                rig.queue.write_stream("stdout", "before the prompt", {"msg_id": "p"})
                return rig.queue.put_ordered(send)

            assert await trio.to_thread.run_sync(produce)  # queued: messages were ahead of it
            await r.read_until(count_is(4), 10)
            with trio.fail_after(10):
                await done.wait()
        assert ran == [(4, True)]  # all four had been handed to the XPUB, in the io run
        assert streams(r.non_welcome()) == [("stdout", "before the prompt", "p")]

    trio.run(main)


def test_an_ordered_send_with_nothing_ahead_is_the_callers(rig_factory: Any) -> None:
    """The fast path: nothing queued or in flight, or the queue closed (the
    iopub task takes nothing after its close marker): put_ordered queues
    nothing and returns False, and the caller sends at once."""
    rig = rig_factory()
    sub = rig.subscriber()

    async def main() -> None:
        async with welcomed(rig, sub) as (r, _):
            assert not rig.queue.put_ordered(lambda: pytest.fail("queued with nothing ahead"))
            await trio.to_thread.run_sync(lambda: rig.queue.put_from_thread(rig.display(0)))
            await r.read_until(count_is(1), 10)
            await _until(lambda: not rig.queue.put_ordered(lambda: None))  # the credit is back
            rig.queue.close()
            assert not rig.queue.put_ordered(lambda: pytest.fail("queued after close"))

    trio.run(main)


def test_status_from_a_thread_never_waits(rig_factory: Any) -> None:
    """put_status_nowait takes a credit, else the io run's overdraft,
    else refuses (False) at once: the caller leaves idle to the io run."""
    rig = rig_factory(capacity=1)
    q = rig.queue

    async def main() -> None:
        q.attach()  # the io thread is this run's; the producer below is another thread

        def produce() -> list[bool]:
            assert q.put_from_thread(rig.display(0))  # the one credit
            return [q.put_status_nowait(rig.session.status("idle", None)) for _ in range(IO_OVERDRAFT + 1)]

        results = await trio.to_thread.run_sync(produce)
        assert results == [True] * IO_OVERDRAFT + [False]
        q.close()
        assert not await trio.to_thread.run_sync(lambda: q.put_status_nowait(rig.session.status("idle", None)))

    trio.run(main)
