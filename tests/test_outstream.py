"""Tier 2: user-side output (outstream.OutStream, Publisher, ParentTracker,
threadparent) into a real IOPubQueue, drained by the real IOPubTask.

The producers are the test's threads, as user code's would be: the main
thread inside ``ParentTracker.running(msg)`` as a job runs a request, and
threads it starts. The iopub task runs in a trio run on a helper thread
(the fake io run) and owns a real XPUB bound on loopback; the test reads a
real SUB and decodes every message. Some tests write before that run
starts (so what coalesces is not a matter of timing) or never start it
(backpressure). No kernel subprocess, no IPython: fast.

Covered: parent routing (the running request, else the latest execute
request; silent requests never become it), threads and pool work keeping
the request that started them, writes coalescing into stream batches and
what seals one, flush() keeping order without sending anything, silent
requests publishing no output (``silenced``), backpressure (a full queue
blocks the producer; draining or close() frees it, ``dropped_closed``),
writes from the io thread or after close going to the terminal, and a
forked child writing whole lines to its fd.
"""

from __future__ import annotations

import io
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import trio
import zmq

from trikernel.protocol.messages import MessageBuilder
from trikernel.protocol.wire import Message, Signer, deserialize
from trikernel.server.iopubqueue import IOPubQueue, IOPubStats
from trikernel.server.iopubtask import IOPubTask
from trikernel.user import threadparent
from trikernel.user.outstream import OutStream, ParentTracker, Publisher, current_request

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.timeout(30)

KEY = b"tier2-outstream-key"
TIMEOUT = 5.0


class Rig:
    """A queue, its iopub task on a fake io run, a subscriber, and the
    user-side objects writing into the queue."""

    def __init__(self, capacity: int = 1000, stream_batch_chars: int = 1 << 16):
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_NODROP, 1)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.linger = 0
        port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://127.0.0.1:{port}")
        self.stats = IOPubStats()
        self.queue = IOPubQueue(capacity, stream_batch_chars, self.stats, Signer(KEY))
        self.builder = MessageBuilder()
        self.task = IOPubTask(self.xpub, self.queue, self.builder, send_timeout=TIMEOUT, warn_after=TIMEOUT)
        self.parents = ParentTracker()
        self.terminal = io.StringIO()  # the kernel's real terminal stream
        self.out = OutStream("stdout", self.queue, self.parents, self.terminal)
        self.err = OutStream("stderr", self.queue, self.parents, self.terminal)
        self.publisher = Publisher(self.builder, self.queue, self.parents)
        self.verifier = Signer(KEY)
        self.received: list[Message] = []
        self.token: trio.lowlevel.TrioToken | None = None
        self._shutdown: trio.Event | None = None
        self._thread: threading.Thread | None = None

    def request(self, msg_type: str = "execute_request", **content: Any) -> Message:
        return self.builder.msg(msg_type, content)

    # -- the fake io run ------------------------------------------------------
    def start(self) -> None:
        """Start the iopub task; returns once it runs and welcomed us."""
        assert self.xpub.poll(int(TIMEOUT * 1000), zmq.POLLIN), "the subscription never arrived"
        started = threading.Event()

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            self._shutdown = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.task.run)
                started.set()
                await self._shutdown.wait()
                self.queue.close()  # the task drains the queue, then returns

        self._thread = threading.Thread(target=trio.run, args=(main,), name="fake-io-run", daemon=True)
        self._thread.start()
        assert started.wait(TIMEOUT)
        welcome = self.next_message()
        assert welcome.msg_type == "iopub_welcome"

    def in_io_thread(self, fn: Callable[[], None]) -> None:
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        assert self.token is not None
        self.token.run_sync_soon(call)
        assert done.wait(TIMEOUT)

    def close(self) -> None:
        if self._thread is not None:
            assert self.token is not None
            assert self._shutdown is not None
            self.token.run_sync_soon(self._shutdown.set)
            self._thread.join(TIMEOUT)
            assert not self._thread.is_alive(), "the iopub task did not end"
        self.sub.close(linger=0)
        self.xpub.close(linger=0)
        self.ctx.term()

    # -- the subscriber -------------------------------------------------------
    def next_message(self, timeout: float = TIMEOUT) -> Message:
        assert self.sub.poll(int(timeout * 1000)), f"nothing on IOPub within {timeout}s"
        return deserialize(self.sub.recv_multipart(), self.verifier)

    def mark(self) -> list[Message]:
        """Publish a marker outside any request; return everything before it
        (FIFO: what was queued before the marker has arrived then). The
        marker is a display_data, so it seals open stream batches and never
        joins one."""
        token = current_request.set(None)
        try:
            self.publisher.send("display_data", {"data": {"text/plain": "MARK"}, "metadata": {}, "transient": {}})
        finally:
            current_request.reset(token)
        out: list[Message] = []
        while True:
            m = self.next_message()
            if m.msg_type == "display_data" and m.content["data"] == {"text/plain": "MARK"}:
                return out
            out.append(m)


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def streams(msgs: list[Message]) -> list[tuple[str, str, str | None]]:
    """(name, text, parent msg_id) of each stream message."""
    return [
        (m.content["name"], m.content["text"], m.parent_header.get("msg_id")) for m in msgs if m.msg_type == "stream"
    ]


def stream_text(msgs: list[Message], name: str = "stdout") -> str:
    return "".join(text for n, text, _ in streams(msgs) if n == name)


def wait_until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


# ------------------------------------------------------------------ parents


def test_output_goes_to_the_running_request_else_the_latest_execute(rig: Rig) -> None:
    a = rig.request(code="a")
    comm = rig.request("comm_msg", comm_id="c", data={})
    rig.start()
    rig.out.write("before any request\n")
    with rig.parents.running(a, execute=True):
        rig.out.write("in a\n")
        with rig.parents.running(comm):  # a widget callback while the cell awaits
            rig.out.write("in the comm handler\n")
        rig.out.write("a again\n")
    rig.out.write("after a\n")  # no request: the latest execute request's
    assert rig.parents.latest == a.header
    assert rig.parents.request() is a
    got = streams(rig.mark())
    assert got == [
        ("stdout", "before any request\n", None),
        ("stdout", "in a\n", a.msg_id),
        ("stdout", "in the comm handler\n", comm.msg_id),
        ("stdout", "a again\nafter a\n", a.msg_id),  # same stream and parent: one batch
    ]


def test_threads_and_pool_work_keep_the_request_that_started_them(rig: Rig) -> None:
    """threadparent.py: a Thread (and one it starts, a subclass with its own
    run, a Timer) prints into the request that started it, also while a
    later request runs; pool work into the request that submitted it, the
    worker being reused."""
    threadparent.install()
    a, b = rig.request(code="a"), rig.request(code="b")
    rig.start()
    go = threading.Event()
    pool = ThreadPoolExecutor(1)  # created outside any request; its worker is reused
    started: list[threading.Thread] = []

    def later(text: str) -> None:
        assert go.wait(TIMEOUT)
        rig.out.write(text)

    def thread_of_a() -> None:
        grandchild = threading.Thread(target=later, args=("grandchild of a\n",), daemon=True)
        grandchild.start()
        started.append(grandchild)
        later("thread of a\n")
        rig.err.write("stderr of a's thread\n")
        rig.publisher.send("display_data", {"data": {"text/plain": "display of a's thread"}, "metadata": {}})

    class Sub(threading.Thread):
        def run(self) -> None:  # overrides run: the request is set before it
            later("subclass of a\n")

    try:
        with rig.parents.running(a, execute=True):
            threads = [threading.Thread(target=thread_of_a, daemon=True), Sub(daemon=True)]
            timer = threading.Timer(0, later, args=("timer of a\n",))
            timer.daemon = True
            threads.append(timer)
            for t in threads:
                t.start()
            pool.submit(rig.out.write, "pool work of a\n").result(TIMEOUT)
            mapped = pool.map(lambda i: later(f"mapped in a {i}\n"), range(2))
        with rig.parents.running(b, execute=True):
            go.set()  # a's threads print while b runs
            for t in threads + started:
                t.join(TIMEOUT)
            list(mapped)
            pool.submit(rig.out.write, "pool work of b\n").result(TIMEOUT)
        outside = threading.Thread(target=rig.out.write, args=("thread of nobody\n",), daemon=True)
        outside.start()
        outside.join(TIMEOUT)
    finally:
        pool.shutdown()
    msgs = rig.mark()
    line_parent = {line: parent for _, text, parent in streams(msgs) for line in text.splitlines()}
    assert line_parent == {
        "pool work of a": a.msg_id,
        "thread of a": a.msg_id,  # printed while b ran
        "stderr of a's thread": a.msg_id,
        "grandchild of a": a.msg_id,
        "subclass of a": a.msg_id,
        "timer of a": a.msg_id,
        "mapped in a 0": a.msg_id,
        "mapped in a 1": a.msg_id,
        "pool work of b": b.msg_id,  # the same pool worker, now for b
        "thread of nobody": b.msg_id,  # started outside any request: the latest execute request
    }
    shown = [m.parent_header["msg_id"] for m in msgs if m.msg_type == "display_data"]
    assert shown == [a.msg_id]


# ---------------------------------------------------------------- coalescing


def test_writes_coalesce_and_another_stream_or_parent_seals_the_batch(rig: Rig) -> None:
    """Written before the iopub task runs, so nothing leaves meanwhile."""
    a, b = rig.request(code="a"), rig.request(code="b")
    with rig.parents.running(a, execute=True):
        for i in range(100):
            print(i, file=rig.out)  # two writes per print
        rig.err.write("oops\n")  # another stream: seals stdout's batch
        rig.out.write("tail of a\n")
    with rig.parents.running(b, execute=True):
        rig.out.write("b\n")  # another parent: a new batch
    rig.out.writelines(["x", "y\n"])  # still b's (the latest)
    rig.start()
    got = streams(rig.mark())
    assert got == [
        ("stdout", "".join(f"{i}\n" for i in range(100)), a.msg_id),
        ("stderr", "oops\n", a.msg_id),
        ("stdout", "tail of a\n", a.msg_id),
        ("stdout", "b\nxy\n", b.msg_id),
    ]
    assert rig.stats.stream_writes == 200 + 5
    assert rig.stats.stream_messages == len(got)


def test_a_flood_from_threads_arrives_whole_and_in_order(rig: Rig) -> None:
    a = rig.request(code="flood")
    rig.start()
    n, lines = 4, 500

    def flood(t: int) -> None:
        for i in range(lines):
            rig.out.write(f"{t}:{i}\n")

    with rig.parents.running(a, execute=True):
        threads = [threading.Thread(target=flood, args=(t,), daemon=True) for t in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    msgs = rig.mark()
    text = stream_text(msgs)
    for t in range(n):
        assert [line for line in text.splitlines() if line.startswith(f"{t}:")] == [f"{t}:{i}" for i in range(lines)]
    assert len(text.splitlines()) == n * lines
    assert {p for _, _, p in streams(msgs)} == {a.msg_id}
    assert rig.stats.stream_messages == len(streams(msgs))
    assert rig.stats.stream_messages < rig.stats.stream_writes  # coalesced


def test_flush_keeps_order_and_sends_nothing_by_itself(rig: Rig) -> None:
    a = rig.request(code="a")
    rig.start()
    with rig.parents.running(a, execute=True):
        print("progress", end="", file=rig.out, flush=True)
        writes = rig.stats.stream_writes
        rig.out.flush()
        assert rig.out.write("") == 0
        assert rig.stats.stream_writes == writes  # neither queued anything
        rig.publisher.send("display_data", {"data": {"text/plain": "shown"}, "metadata": {}, "transient": {}})
        rig.out.write(" done\n")
    msgs = rig.mark()
    kinds = [(m.msg_type, m.content.get("text", m.content.get("data"))) for m in msgs]
    assert kinds == [
        ("stream", "progress"),
        ("display_data", {"text/plain": "shown"}),
        ("stream", " done\n"),
    ]
    assert all(m.parent_header["msg_id"] == a.msg_id for m in msgs)


# --------------------------------------------------------------------- silent


def test_a_silent_request_publishes_no_output(rig: Rig) -> None:
    """Messaging spec "Execute": silent "will not broadcast output on the
    IOPUB channel"; comm messages are not output and still go out."""
    a = rig.request(code="a")
    s = rig.request(code="s", silent=True)
    rig.start()
    with rig.parents.running(a, execute=True):
        rig.out.write("a\n")
    with rig.parents.running(s, execute=True):
        assert rig.parents.silent()
        rig.out.write("hidden\n")
        rig.err.write("hidden too\n")
        for msg_type in ("display_data", "execute_result", "error"):
            rig.publisher.send(msg_type, {"data": {}, "metadata": {}})
        rig.publisher.send("comm_msg", {"comm_id": "c", "data": {}})
    assert rig.parents.latest == a.header  # a silent request never becomes the latest
    assert rig.stats.silenced == 5
    msgs = rig.mark()
    assert [(m.msg_type, m.parent_header["msg_id"]) for m in msgs] == [
        ("stream", a.msg_id),
        ("comm_msg", s.msg_id),
    ]
    assert "hidden" not in "".join(t for _, t, _ in streams(msgs))


# --------------------------------------------------------------- backpressure


@pytest.fixture
def small() -> Iterator[Rig]:
    """A rig whose queue holds two messages; not started unless a test does."""
    r = Rig(capacity=2)
    try:
        yield r
    finally:
        r.close()


def test_a_full_queue_blocks_the_producer_until_close_drops_its_write(small: Rig) -> None:
    small.out.write("a")  # credit 1
    small.err.write("b")  # credit 2 (another stream: a new batch)
    blocked = threading.Thread(target=small.out.write, args=("c",), daemon=True)  # a new batch: no credit left
    blocked.start()
    wait_until(lambda: small.stats.producer_blocks == 1, "the producer blocks")
    assert blocked.is_alive()
    small.queue.close()  # the io run at shutdown: the waiter wakes and drops its text
    blocked.join(TIMEOUT)
    assert not blocked.is_alive()
    assert small.stats.dropped_closed == 1
    small.out.write("late")  # after close: to the terminal, never blocking
    small.publisher.send("display_data", {"data": {}, "metadata": {}})  # dropped, counted
    assert small.terminal.getvalue() == "late"
    assert small.stats.dropped_closed == 2


def test_a_message_made_after_close_is_dropped_unsigned(small: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that keeps displaying after shutdown closed the queue must not
    pay the signing of every dropped message (issue 26: 200000 of them outlived
    the 30 s shutdown wait on a loaded machine, and the kernel was killed)."""
    import trikernel.server.iopubqueue as iopubqueue

    signed: list[str] = []
    real = iopubqueue.serialize
    monkeypatch.setattr(
        iopubqueue, "serialize", lambda msg, signer: (signed.append(msg.msg_type), real(msg, signer))[1]
    )
    small.queue.close()
    for _ in range(3):
        small.publisher.send("display_data", {"data": {}, "metadata": {}})
    assert small.stats.dropped_closed == 3
    assert signed == []


def test_a_blocked_producer_resumes_when_the_queue_drains(small: Rig) -> None:
    a = small.request(code="a")
    pieces = [(small.out if i % 2 == 0 else small.err, f"{i} ") for i in range(20)]

    def produce() -> None:
        with small.parents.running(a, execute=True):
            for stream, text in pieces:
                stream.write(text)  # each a new batch: one credit each

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_until(lambda: small.stats.producer_blocks >= 1, "the producer blocks")
    assert producer.is_alive()
    small.start()  # the iopub task returns credits as messages leave
    producer.join(TIMEOUT)
    assert not producer.is_alive()
    got = streams(small.mark())
    assert got == [("stdout" if i % 2 == 0 else "stderr", f"{i} ", a.msg_id) for i in range(20)]
    assert small.stats.dropped_closed == 0


# ----------------------------------------------------------- the terminal path


def test_writes_in_the_io_thread_go_to_the_terminal(rig: Rig) -> None:
    rig.start()
    rig.in_io_thread(lambda: rig.out.write("from the io thread\n"))  # must never block on its own queue
    assert rig.terminal.getvalue() == "from the io thread\n"
    assert streams(rig.mark()) == []
    assert rig.stats.stream_writes == 0


def test_stream_basics() -> None:
    rig = Rig()
    try:
        out = rig.out
        assert out.name == "<stdout>"
        assert rig.err.name == "<stderr>"
        assert out.writable()
        assert not out.isatty()
        assert out.encoding == "UTF-8"  # as ipykernel spells it
        with pytest.raises(TypeError, match="must be str"):
            out.write(b"bytes")  # type: ignore[arg-type]
        with pytest.raises(io.UnsupportedOperation):
            out.fileno()  # a StringIO terminal has none
        with open(os.devnull, "w") as devnull:
            assert OutStream("stdout", rig.queue, rig.parents, devnull).fileno() == devnull.fileno()
        with pytest.raises(io.UnsupportedOperation):
            OutStream("stdout", rig.queue, rig.parents).fileno()
    finally:
        rig.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() of a multi-threaded process (3.12+)
def test_a_forked_child_writes_whole_lines_to_its_fd() -> None:
    """A forked child's copy of the queue is drained by nobody: it writes
    to fd 1 instead (the capture pipe in a kernel), a line at a time."""
    rig = Rig()
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: only os-level calls after this
            try:
                os.dup2(w, 1)
                rig.out.write("ab")
                os.write(1, b"|")  # "ab" is held back until its line ends
                rig.out.write("c\nd")
                rig.out.flush()  # writes out the unfinished line
                rig.publisher.send("display_data", {"data": {}, "metadata": {}})  # logged, dropped: never blocks
            finally:
                os._exit(0)
        os.close(w)
        w = -1
        chunks = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            data = os.read(r, 4096)
            if not data:
                break
            chunks.append(data)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert b"".join(chunks) == b"|ab" + b"c\nd"
        assert rig.stats.stream_writes == 0  # nothing reached the parent's queue
    finally:
        os.close(r)
        if w != -1:
            os.close(w)
        rig.close()
