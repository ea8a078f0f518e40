"""Tier 2: the io run (server and core, stdin bridge, IOPub) with a fake user run.

The real io run (server.iorun.IORun with core.kernelcore.KernelCore,
server.requests.RequestServer, server.stdin.StdinBridge and
server.iopubtask.IOPubTask) serves real ZeroMQ sockets on loopback, bound
by server.sockets.create_and_bind with the default options. The user run is
a fake (xeus's mock interpreter and ipykernel's MockKernel are the models):
jobs run as tasks of the io run itself, and FakeJobs answers like
user.interpreter.Interpreter would, or fails on purpose. The core alone,
with no ZeroMQ at all, is tests/test_core.py. Clients are jupyter_client Session objects on
raw DEALER/SUB sockets. No kernel subprocess, no IPython: fast.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import trio
import zmq
from jupyter_client.session import Session

from trikernel.core.badinput import BadInputLog
from trikernel.core.kernelcore import CoreDeps, KernelCore
from trikernel.core.table import ROUTES
from trikernel.errors import KernelShuttingDown
from trikernel.launch.config import KernelConfig
from trikernel.protocol.connection import ConnectionInfo
from trikernel.protocol.messages import MessageBuilder, kernel_info_content
from trikernel.protocol.wire import Message, Signer
from trikernel.server import sockopts
from trikernel.server.inbound import InboundParser
from trikernel.server.iopubqueue import IOPubQueue, IOPubStats
from trikernel.server.iopubtask import IOPubTask
from trikernel.server.iorun import IORun, IORunParts
from trikernel.server.requests import RequestServer
from trikernel.server.sockets import BoundSockets, TrioSocket, create_and_bind
from trikernel.server.stdin import StdinBridge

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trikernel.user.userrun import Job

pytestmark = pytest.mark.timeout(60)

KEY = b"tier2-dispatch-key"
TIMEOUT = 10.0


class FakeUserRun:
    """Runs each job as a system task of the io run (no second thread)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.busy = False
        self.stopping = False
        self.interrupts = 0
        self.refuse = False  # behave like a user run that has ended

    def start_job_soon(self, job: Job) -> None:
        if self.refuse:
            raise KernelShuttingDown("the user run has ended")
        trio.lowlevel.spawn_system_task(job.run)

    start_task_soon = start_job_soon

    def interrupt(self) -> None:
        self.interrupts += 1

    def stop(self) -> None:
        self.stopping = True
        self.stopped.set()


@dataclass
class FakeJobs:
    """Stands in for user.interpreter.Interpreter; ``execute`` obeys the cell's code."""

    execution_count: int = 1
    ran: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    stdin: StdinBridge | None = None

    async def execute(self, msg: Message) -> dict[str, Any]:
        code = msg.content.get("code", "")
        if code == "interrupted":
            raise KeyboardInterrupt
        if code == "crash":
            raise RuntimeError("bug in a job")
        if code.startswith("input"):
            assert self.stdin is not None
            value = await trio.to_thread.run_sync(self.stdin.request_input, msg, code, False)
            self.inputs.append(value)
        self.ran.append(code)
        self.execution_count += 1
        if code == "fail":
            # a real failing cell takes milliseconds (IPython formats the
            # traceback); the burst behind it is dated within that time
            await trio.sleep(0.02)
            return {
                "status": "error",
                "ename": "ValueError",
                "evalue": "x",
                "traceback": [],
                "execution_count": self.execution_count - 1,
            }
        return {"status": "ok", "execution_count": self.execution_count - 1, "user_expressions": {}, "payload": []}

    def complete(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "matches": ["x"], "cursor_start": 0, "cursor_end": 0, "metadata": {}}

    def inspect(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}

    def is_complete(self, msg: Message) -> dict[str, Any]:
        return {"status": "complete"}

    def history(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "history": []}

    def comm(self, msg: Message) -> None:
        if msg.content.get("data", {}).get("interrupt"):
            raise KeyboardInterrupt

    def comm_info(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "comms": {}}


class Client:
    """A jupyter_client Session on raw DEALER (shell, control, stdin) and SUB sockets."""

    def __init__(self, ctx: zmq.Context[Any], ports: dict[str, int]):
        self.session = Session(key=KEY)
        self.socks: dict[str, zmq.Socket[Any]] = {}
        ident = self.session.bsession
        for channel in ("shell", "control", "stdin"):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.setsockopt(zmq.IDENTITY, ident)
            s.connect(f"tcp://127.0.0.1:{ports[channel + '_port']}")
            self.socks[channel] = s
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{ports['iopub_port']}")
        self.socks["iopub"] = sub
        self.wait_welcome()

    def wait_welcome(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.recv("iopub", 0.2, none_ok=True) is not None:
                return
        raise AssertionError("no iopub_welcome")

    def send(self, channel: str, msg_type: str, content: dict[str, Any] | None = None, **header: Any) -> str:
        return self.send_prepared(channel, self.prepare(msg_type, content, **header))

    def prepare(self, msg_type: str, content: dict[str, Any] | None = None, **header: Any) -> dict[str, Any]:
        """A message made now (its header date is now) to send later."""
        msg = self.session.msg(msg_type, content or {})
        msg["header"].update(header)
        return msg

    def send_prepared(self, channel: str, msg: dict[str, Any]) -> str:
        self.session.send(self.socks[channel], msg)
        return str(msg["header"]["msg_id"])

    def recv(self, channel: str, timeout: float = TIMEOUT, *, none_ok: bool = False) -> dict[str, Any] | None:
        sock = self.socks[channel]
        if not sock.poll(int(timeout * 1000)):
            if none_ok:
                return None
            raise AssertionError(f"nothing on {channel} within {timeout}s")
        _, frames = self.session.feed_identities(sock.recv_multipart())
        return self.session.deserialize(frames)

    def reply(self, channel: str, msg_id: str) -> dict[str, Any]:
        while True:
            m = self.recv(channel)
            assert m is not None
            if m["parent_header"].get("msg_id") == msg_id:
                return m

    def iopub_of(self, msg_id: str) -> list[dict[str, Any]]:
        """IOPub messages of ``msg_id`` up to its idle."""
        out: list[dict[str, Any]] = []
        while True:
            m = self.recv("iopub")
            assert m is not None
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            out.append(m)
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return out


@dataclass
class Rig:
    io: IORun
    user_run: FakeUserRun
    jobs: FakeJobs
    client: Client
    bound: BoundSockets
    ctx: zmq.Context[Any]

    def other_client(self) -> Client:
        return Client(self.ctx, self.bound.ports)


@pytest.fixture
def rig() -> Iterator[Rig]:
    options = sockopts.resolve([], {}, None)
    bound = create_and_bind(ConnectionInfo(key=KEY), lambda s, c: sockopts.apply_options(s, c, options))
    signer = Signer(KEY)
    builder = MessageBuilder()
    config = KernelConfig(shutdown_grace=1.0)
    queue = IOPubQueue(1000, 1 << 16, IOPubStats(), signer)
    user_run = FakeUserRun()
    bad_input = BadInputLog()
    parse = InboundParser(signer, bad_input)
    stdin = StdinBridge(builder, parse)
    shut = threading.Event()
    requests = RequestServer({c: TrioSocket(bound.sockets[c], c) for c in ("shell", "control")}, parse, queue)
    core = KernelCore(
        CoreDeps(
            builder=builder,
            transport=requests,
            main_run=user_run,  # type: ignore[arg-type]
            kernel_info=lambda: kernel_info_content(debugger=True),
            request_shutdown=shut.set,
            bad_input=bad_input,
        )
    )
    requests.attach(core)
    iopub = IOPubTask(bound.sockets["iopub"], queue, builder, send_timeout=5.0, warn_after=1.0)
    io = IORun(
        IORunParts(
            builder,
            queue,
            iopub,
            core,
            requests,
            stdin,
            TrioSocket(bound.sockets["stdin"], "stdin"),
            user_run,  # type: ignore[arg-type]
            config.shutdown_grace,
            config.parent_poll_interval,
        )
    )
    io.start()
    assert io.wait_ready()
    jobs = FakeJobs(stdin=stdin)
    io.token.run_sync_soon(core.user_side_ready, jobs)
    ctx: zmq.Context[Any] = zmq.Context()
    client = Client(ctx, bound.ports)
    try:
        yield Rig(io, user_run, jobs, client, bound, ctx)
    finally:
        io.request_shutdown()
        assert io.join(10), "io run did not stop"
        ctx.destroy(linger=0)
        bound.close(linger=0, hb=True)
        bound.context.term()
        bound.hb_context.term()


def states(msgs: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["execution_state"] for m in msgs if m["msg_type"] == "status"]


@pytest.mark.parametrize(
    ("channel", "msg_type", "content"),
    [
        ("shell", "execute_request", {"code": "ok", "silent": False}),
        ("shell", "complete_request", {"code": "x", "cursor_pos": 1}),
        ("shell", "inspect_request", {"code": "x", "cursor_pos": 1}),
        ("shell", "is_complete_request", {"code": "x"}),
        ("shell", "history_request", {"hist_access_type": "tail", "n": 1}),
        ("shell", "comm_info_request", {}),
        ("shell", "kernel_info_request", {}),
        ("control", "kernel_info_request", {}),
        ("control", "interrupt_request", {}),
        ("control", "usage_request", {}),
    ],
)
def test_every_request_is_bracketed_and_answered(
    rig: Rig, channel: str, msg_type: str, content: dict[str, Any]
) -> None:
    msg_id = rig.client.send(channel, msg_type, content)
    reply = rig.client.reply(channel, msg_id)
    assert reply["msg_type"] == msg_type.replace("_request", "_reply")
    assert reply["content"]["status"] == ("complete" if msg_type == "is_complete_request" else "ok"), reply["content"]
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]


def test_the_table_names_every_handler_once() -> None:
    assert all(r.channels and r.handler for r in ROUTES.values())
    assert {"execute_request", "kernel_info_request", "comm_msg", "usage_request"} <= set(ROUTES)


@pytest.mark.parametrize("channel", ["shell", "control"])
def test_unknown_requests_get_an_error_reply_and_busy_idle(rig: Rig, channel: str) -> None:
    msg_id = rig.client.send(channel, "frobnicate_request", {})
    reply = rig.client.reply(channel, msg_id)
    assert reply["msg_type"] == "frobnicate_reply"
    assert reply["content"]["status"] == "error"
    assert "frobnicate_request" in reply["content"]["evalue"]
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]


def test_unknown_non_request_on_shell_is_bracketed_without_reply(rig: Rig) -> None:
    msg_id = rig.client.send("shell", "something_odd", {})
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]
    assert rig.client.recv("shell", 0.3, none_ok=True) is None


def test_shell_type_on_control_is_not_run(rig: Rig) -> None:
    msg_id = rig.client.send("control", "execute_request", {"code": "on control"})
    assert rig.client.reply("control", msg_id)["content"]["status"] == "error"
    assert "on control" not in rig.jobs.ran


@pytest.mark.parametrize(("code", "ename"), [("interrupted", "KeyboardInterrupt"), ("crash", "RuntimeError")])
def test_a_failing_job_gets_an_error_reply_and_idle_and_the_channel_serves_on(rig: Rig, code: str, ename: str) -> None:
    msg_id = rig.client.send("shell", "execute_request", {"code": code})
    reply = rig.client.reply("shell", msg_id)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == ename
    assert "execution_count" not in reply["content"]  # no count of its own (control.request_error)
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]
    msg_id = rig.client.send("shell", "execute_request", {"code": "after"})
    assert rig.client.reply("shell", msg_id)["content"]["status"] == "ok"


def test_interrupted_comm_handler_and_comm_info_at_shutdown_keep_the_run(rig: Rig) -> None:
    """Issue 9.9: a JobInterrupted or a shut-down user run on the comm path
    used to escape into the shell task's nursery and end the io run."""
    msg_id = rig.client.send("shell", "comm_msg", {"comm_id": "c", "data": {"interrupt": True}})
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]
    rig.user_run.refuse = True
    msg_id = rig.client.send("shell", "comm_info_request", {})
    reply = rig.client.reply("shell", msg_id)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KernelShuttingDown"
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]
    rig.user_run.refuse = False
    msg_id = rig.client.send("control", "kernel_info_request")
    assert rig.client.reply("control", msg_id)["content"]["status"] == "ok"


def test_interrupt_request_interrupts_the_user_run(rig: Rig) -> None:
    rig.client.reply("control", rig.client.send("control", "interrupt_request"))
    assert rig.user_run.interrupts == 1


def test_stop_on_error_aborts_only_queued_executes(rig: Rig) -> None:
    c = rig.client
    # made first, then sent back to back, as a frontend's Run All does (the
    # fake user run fails in microseconds, before the last ones arrive)
    burst = [c.prepare("execute_request", {"code": "fail"})]
    burst.append(c.prepare("complete_request", {"code": "x", "cursor_pos": 1}))
    burst += [c.prepare("execute_request", {"code": f"cell {i}"}) for i in range(20)]
    burst.append(c.prepare("inspect_request", {"code": "x", "cursor_pos": 1}))
    ids = [c.send_prepared("shell", m) for m in burst]
    replies = {r["parent_header"]["msg_id"]: r for r in (c.recv("shell") for _ in ids) if r}
    assert replies[ids[0]]["content"]["ename"] == "ValueError"
    assert replies[ids[1]]["content"]["status"] == "ok"  # complete answered normally
    assert replies[ids[-1]]["content"]["status"] == "ok"  # inspect too
    aborted = [replies[i]["content"].get("ename") for i in ids[2:-1]]
    assert aborted == ["ExecutionAborted"] * 20
    assert [replies[i]["metadata"]["status"] for i in ids[2:-1]] == ["aborted"] * 20
    assert rig.jobs.ran == ["fail"]
    # a request sent after the error reply runs normally
    after = c.send("shell", "execute_request", {"code": "after"})
    assert c.reply("shell", after)["content"]["status"] == "ok"


def test_stop_on_error_false_and_silent_do_not_abort(rig: Rig) -> None:
    c = rig.client
    first = c.send("shell", "execute_request", {"code": "fail", "stop_on_error": False})
    second = c.send("shell", "execute_request", {"code": "next"})
    c.reply("shell", first)
    assert c.reply("shell", second)["content"]["status"] == "ok"


def test_abort_window_uses_the_clients_clock_not_the_kernels(rig: Rig) -> None:
    """A client whose clock is an hour behind: its requests sent after the
    error reply still run; those dated before the failure are aborted even
    when they arrive late."""
    c = rig.client
    hour_ago = time.time() - 3600

    def dated(offset: float) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(hour_ago + offset, UTC).isoformat()

    failed = c.send("shell", "execute_request", {"code": "fail"}, date=dated(0))
    c.reply("shell", failed)
    late_but_sent_before = c.send("shell", "execute_request", {"code": "late"}, date=dated(0.0001))
    assert c.reply("shell", late_but_sent_before)["content"]["ename"] == "ExecutionAborted"
    after = c.send("shell", "execute_request", {"code": "after"}, date=dated(60))
    assert c.reply("shell", after)["content"]["status"] == "ok"
    assert "late" not in rig.jobs.ran
    assert "after" in rig.jobs.ran


def test_two_inputs_at_once_each_get_their_own_answer(rig: Rig) -> None:
    c = rig.client
    second = rig.other_client()
    ids = [c.send("shell", "execute_request", {"code": "input A", "allow_stdin": True})]
    # B's request is sent once A's input is pending: sent at once, both could
    # be queued on the ROUTER before it reads, and it takes peers in turn, so
    # B's was served first now and then (a clean-clone run under load: A got
    # no input_request and B's waited for an answer that never came)
    req_a = c.recv("stdin")
    ids.append(second.send("shell", "execute_request", {"code": "input B", "allow_stdin": True}))
    # sequential lane: A asks first; answer it, then B asks
    assert req_a is not None
    assert req_a["content"]["prompt"] == "input A"
    c.session.send(c.socks["stdin"], c.session.msg("input_reply", {"value": "a"}, parent=req_a))
    req_b = second.recv("stdin")
    assert req_b is not None
    assert req_b["content"]["prompt"] == "input B"
    second.session.send(second.socks["stdin"], second.session.msg("input_reply", {"value": "b"}, parent=req_b))
    c.reply("shell", ids[0])
    second.reply("shell", ids[1])
    assert rig.jobs.inputs == ["a", "b"]


def test_control_is_served_while_a_flood_arrives_on_shell(rig: Rig) -> None:
    """The channel tasks checkpoint per message: a continuous flood on shell
    does not starve control (issue 9.9: the receive fast path returned
    without a checkpoint)."""
    flooder = rig.ctx.socket(zmq.DEALER)
    flooder.linger = 0
    flooder.connect(f"tcp://127.0.0.1:{rig.bound.ports['shell_port']}")
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            flooder.send_multipart([b"<IDS|MSG>", b"bad", b"{}", b"{}", b"{}", b"{}"])

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        time.sleep(0.3)  # the flood is on (it runs until stopped; nothing to wait for)
        # answered while the flood goes on (it stops only after): served, not starved
        rig.client.reply("control", rig.client.send("control", "kernel_info_request"))
        assert t.is_alive()
    finally:
        stop.set()
        t.join(5)
        flooder.close(linger=0)


def test_shutdown_reply_then_shutdown(rig: Rig) -> None:
    msg_id = rig.client.send("control", "shutdown_request", {"restart": False})
    reply = rig.client.reply("control", msg_id)
    assert reply["content"] == {"status": "ok", "restart": False}
    assert states(rig.client.iopub_of(msg_id)) == ["busy", "idle"]


def test_an_abandoned_input_request_is_not_delivered_late() -> None:
    """Regression (review): an input_request the ROUTER could not route is
    retried (stdinbridge.ROUTE_TIMEOUT). If Ctrl-C abandons the input() while
    a retry sleeps, and the client's stdin socket joins meanwhile, the retry
    must not deliver the request anyway: the client would show a prompt for
    a cell that was interrupted, and its answer would go to no one."""
    from types import SimpleNamespace

    from trikernel.server.stdin import RETRY_MAX_DELAY, _Slot

    class Sock:
        def __init__(self) -> None:
            self.routable = False
            self.sent: list[list[bytes]] = []

        def send_nowait(self, frames: list[bytes], *, quiet: bool = False) -> bool:
            if self.routable:
                self.sent.append(frames)
            return self.routable

        async def recv_multipart(self) -> list[bytes]:
            await trio.sleep_forever()
            raise AssertionError

    builder = MessageBuilder()
    bridge = StdinBridge(builder, SimpleNamespace(signer=Signer(KEY), message_log=None))  # type: ignore[arg-type]
    sock = Sock()

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(bridge.serve, sock)
            parent = builder.msg("execute_request", {}, None, identities=(b"client",))
            content = {"prompt": "", "password": False}
            msg = builder.msg("input_request", content, parent.header, identities=(b"client",))
            bridge._send_request(msg, _Slot())
            assert not sock.sent  # not routable: a retry task sleeps
            await trio.sleep(0.001)  # the retry task runs and sleeps (its only checkpoint)
            bridge._pending.pop(msg.msg_id)  # what request_input does on KeyboardInterrupt
            sock.routable = True  # the stdin socket joins
            await trio.sleep(RETRY_MAX_DELAY * 3)
            assert sock.sent == []
            n.cancel_scope.cancel()

    trio.run(main)
