"""Tier 2: the kernel core alone (trikernel.core), with no ZeroMQ and no IPython.

xeus's pattern (a mock server and a mock interpreter test ``xkernel_core``
with no transport): :class:`FakeTransport` stands in for the server
(server/requests.py) and records every message the core sends, with the
thread that sent it; :class:`ThreadRun` is a user run on a thread of its own
(a plain ``trio.run`` taking Jobs through its token, as user/userrun.py
does); :class:`FakeInterpreter` answers like user/interpreter.py would, or
fails on purpose. The io run is the test's own ``trio.run``.

``test_the_core_runs_without_zmq_or_ipython`` runs one scenario in a fresh
interpreter in which ``import zmq`` and ``import IPython`` fail.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import trio

from trikernel.core.badinput import BadInputLog
from trikernel.core.interfaces import EMPTY, Empty
from trikernel.core.kernelcore import DRAIN_LIMIT, CoreDeps, KernelCore
from trikernel.core.lanes import CLOCK_MEMORY, SHELL_BACKLOG, AbortWindow, ClientClocks, Lanes, Queued, SequentialLane
from trikernel.errors import KernelShuttingDown
from trikernel.protocol.messages import MessageBuilder, kernel_info_content
from trikernel.protocol.wire import utcnow_iso

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trikernel.core.job import Job
    from trikernel.protocol.wire import Message

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 10.0


@dataclass
class Sent:
    """One message the core sent: ``kind`` "reply" or "iopub", on which thread."""

    kind: str
    channel: str
    msg: Message
    thread: int


class FakeTransport:
    """core.interfaces.Transport, recording; ``pending`` is what
    receive_nowait finds queued on the shell channel."""

    def __init__(self, *, replies_from_threads: bool = True):
        self._threads = replies_from_threads
        self.log: list[Sent] = []
        self.pending: deque[Message | None] = deque()
        self._changed: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._yields = random.Random(17)
        self._idle: set[Any] = set()  # parents whose idle was sent (done() in O(1): tests wait for hundreds)

    def attach(self) -> None:
        """In the io run, before the core serves."""
        self._token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()

    def _note(self, sent: Sent) -> None:
        self.log.append(sent)
        if sent.msg.msg_type == "status" and sent.msg.content["execution_state"] == "idle":
            self._idle.add(sent.msg.parent_header.get("msg_id"))
        assert self._token is not None
        self._token.run_sync_soon(self._wake)

    def _wake(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = trio.Event()

    @property
    def replies_from_threads(self) -> bool:
        return self._threads

    def send(self, channel: str, msg: Message, on_sent: Callable[[float], None] | None = None) -> bool:
        self._note(Sent("reply", channel, msg, threading.get_ident()))
        if on_sent is not None:
            on_sent(time.time())
        return True

    async def publish(self, msg: Message) -> bool:
        self._note(Sent("iopub", "iopub", msg, threading.get_ident()))
        # the real queue may yield (it waits when full, or for credit): zero to
        # two times here, so that requests in flight do not move in lockstep
        for _ in range(self._yields.randint(0, 2)):
            await trio.lowlevel.checkpoint()
        return True

    def publish_status_nowait(self, msg: Message) -> bool:
        self._note(Sent("iopub", "iopub", msg, threading.get_ident()))
        return True

    def receive_nowait(self, channel: str) -> Message | Empty | None:
        return self.pending.popleft() if self.pending else EMPTY

    # -- test helpers (io run) ------------------------------------------------------
    def of(self, msg_id: str) -> list[Sent]:
        """Everything sent with ``msg_id`` as parent, in order."""
        return [s for s in self.log if s.msg.parent_header.get("msg_id") == msg_id]

    def done(self, msg_id: str) -> bool:
        return msg_id in self._idle

    async def changed(self) -> None:
        """Until the core sends something more."""
        assert self._changed is not None
        await self._changed.wait()

    async def wait_idle(self, *msg_ids: str) -> None:
        with trio.fail_after(TIMEOUT):
            while not all(self.done(m) for m in msg_ids):
                assert self._changed is not None
                await self._changed.wait()

    def reply_of(self, msg_id: str) -> Sent:
        (reply,) = [s for s in self.of(msg_id) if s.kind == "reply"]
        return reply

    def shape(self, msg_id: str) -> list[str]:
        """``busy``, the reply's type, ``idle``: what was sent for ``msg_id``, in order."""
        return [
            s.msg.content["execution_state"] if s.msg.msg_type == "status" else s.msg.msg_type for s in self.of(msg_id)
        ]


class ThreadRun:
    """A user run on a thread of its own: core.interfaces.UserRunHandle."""

    def __init__(self) -> None:
        self.busy = False
        self.stopping = False
        self.stopped = threading.Event()
        self.interrupts = 0
        self.ident: int | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._send: trio.MemorySendChannel[Job | None] | None = None
        self._nursery: trio.Nursery | None = None
        self._tasks: trio.MemorySendChannel[Job] | None = None
        #: for each sequential job handed over, how many concurrent ones were handed over before it
        self.tasks_before_job: list[int] = []
        self._tasks_handed = 0
        self._up = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="fake-user-run", daemon=True)
        self._thread.start()
        assert self._up.wait(TIMEOUT)

    async def _main(self) -> None:
        self.ident = threading.get_ident()
        send, recv = trio.open_memory_channel["Job | None"](8)
        tasks_send, tasks_recv = trio.open_memory_channel["Job"](1000)
        async with trio.open_nursery() as nursery:
            self._token, self._send, self._nursery = trio.lowlevel.current_trio_token(), send, nursery
            self._tasks = tasks_send
            nursery.start_soon(self._serve_tasks, tasks_recv)
            self._up.set()
            async for job in recv:
                if job is None:
                    break
                self.busy = True
                try:
                    await job.run()
                finally:
                    self.busy = False
            nursery.cancel_scope.cancel()
        self.stopped.set()

    def start_job_soon(self, job: Job) -> None:
        if self.stopping or self._token is None or self._send is None:
            raise KernelShuttingDown("stopped")
        self.tasks_before_job.append(self._tasks_handed)
        self._token.run_sync_soon(self._send.send_nowait, job)

    async def _serve_tasks(self, recv: trio.MemoryReceiveChannel[Job]) -> None:
        async for job in recv:  # in the order queued, as UserRunHandle.start_task_soon promises
            await job.run()

    def start_task_soon(self, job: Job) -> None:
        assert self._token is not None
        assert self._tasks is not None
        self._tasks_handed += 1
        self._token.run_sync_soon(self._tasks.send_nowait, job)

    def interrupt(self) -> None:
        self.interrupts += 1

    def stop(self) -> None:
        if not self.stopping and self._token is not None and self._send is not None:
            self.stopping = True
            self._token.run_sync_soon(self._send.send_nowait, None)


@dataclass
class FakeInterpreter:
    """core.interfaces.Interpreter; ``execute`` obeys the cell's code:
    ``fail`` is an error reply, ``crash`` raises, ``wait`` blocks until
    ``release`` is set (a threading.Event), anything else succeeds."""

    count: int = 1
    ran: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    comms: list[str] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    async def execute(self, msg: Message) -> dict[str, Any]:
        code = msg.content.get("code", "")
        self.threads.append(threading.get_ident())
        if code == "crash":
            raise RuntimeError("a bug in the interpreter")
        if code == "wait":
            await trio.to_thread.run_sync(self.release.wait, TIMEOUT)
        self.ran.append(code)
        self.count += 1
        if code == "fail":
            return {"status": "error", "ename": "ValueError", "evalue": "x", "traceback": [], "execution_count": 1}
        return {"status": "ok", "execution_count": self.count - 1, "user_expressions": {}, "payload": []}

    def complete(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "matches": ["x"], "cursor_start": 0, "cursor_end": 0, "metadata": {}}

    def inspect(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}

    def is_complete(self, msg: Message) -> dict[str, Any]:
        return {"status": "complete"}

    def history(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "history": []}

    def comm(self, msg: Message) -> None:
        self.comms.append(msg.content.get("comm_id", ""))

    def comm_info(self, msg: Message) -> dict[str, Any]:
        return {"status": "ok", "comms": {}}


@dataclass
class Rig:
    core: KernelCore
    transport: FakeTransport
    run: ThreadRun
    interp: FakeInterpreter
    client: MessageBuilder
    shutdowns: list[float]
    bad_input: BadInputLog

    def request(self, msg_type: str, content: dict[str, Any] | None = None, **header: Any) -> Message:
        msg = self.client.msg(msg_type, content or {})
        msg.header.update(header)
        return msg


def drive(
    script: Callable[[Rig], Awaitable[None]], *, ready: bool = True, replies_from_threads: bool = True, **deps: Any
) -> Rig:
    """Run ``script(rig)`` in a fresh io run with a core serving; the user
    side is up at once unless ``ready`` is False."""
    transport = FakeTransport(replies_from_threads=replies_from_threads)
    run = ThreadRun()
    interp = FakeInterpreter()
    shutdowns: list[float] = []
    bad_input = BadInputLog()
    core = KernelCore(
        CoreDeps(
            builder=MessageBuilder(),
            transport=transport,
            main_run=run,
            kernel_info=lambda: kernel_info_content(debugger=False),
            request_shutdown=lambda: shutdowns.append(trio.current_time()),
            bad_input=bad_input,
            **deps,
        )
    )
    rig = Rig(core, transport, run, interp, MessageBuilder(), shutdowns, bad_input)

    async def main() -> None:
        transport.attach()
        async with trio.open_nursery() as nursery:
            await nursery.start(core.run)
            if ready:
                core.user_side_ready(interp)
            with trio.fail_after(TIMEOUT * 2):
                await script(rig)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        interp.release.set()
        run.stop()
    return rig


# ------------------------------------------------------------------------ the bracket


@pytest.mark.parametrize(
    ("channel", "msg_type", "content"),
    [
        ("shell", "execute_request", {"code": "ok"}),
        ("shell", "complete_request", {"code": "x", "cursor_pos": 1}),
        ("shell", "inspect_request", {"code": "x", "cursor_pos": 1}),
        ("shell", "is_complete_request", {"code": "x"}),
        ("shell", "history_request", {"hist_access_type": "tail", "n": 1}),
        ("shell", "comm_info_request", {}),
        ("shell", "kernel_info_request", {}),
        ("control", "kernel_info_request", {}),
        ("control", "interrupt_request", {}),
        ("control", "usage_request", {}),
        ("control", "list_subshell_request", {}),
    ],
)
def test_every_request_is_busy_reply_idle_in_that_order(channel: str, msg_type: str, content: dict[str, Any]) -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request(msg_type, content)
        await rig.core.receive(channel, msg)
        await rig.transport.wait_idle(msg.msg_id)
        reply_type = msg_type.replace("_request", "_reply")
        assert rig.transport.shape(msg.msg_id) == ["busy", reply_type, "idle"]
        reply = rig.transport.reply_of(msg.msg_id)
        assert reply.channel == channel
        assert reply.msg.content["status"] in ("ok", "complete"), reply.msg.content

    drive(script)


def test_a_succeeded_execute_is_answered_from_the_thread_that_ran_it() -> None:
    """The reply and its idle leave from the user run's thread (context.py,
    "Who sends the reply"); busy from the io run, before the hand-over."""

    async def script(rig: Rig) -> None:
        msg = rig.request("execute_request", {"code": "ok"})
        await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(msg.msg_id)
        busy, reply, idle = rig.transport.of(msg.msg_id)
        assert busy.thread == threading.get_ident()
        assert reply.thread == rig.run.ident == idle.thread
        assert reply.msg.metadata["status"] == "ok"
        assert reply.msg.metadata["engine"] == rig.core.builder.session_id

    drive(script)


def test_with_the_message_log_every_reply_leaves_from_the_io_run() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("execute_request", {"code": "ok"})
        await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(msg.msg_id)
        assert {s.thread for s in rig.transport.of(msg.msg_id)} == {threading.get_ident()}
        assert rig.transport.shape(msg.msg_id) == ["busy", "execute_reply", "idle"]

    drive(script, replies_from_threads=False)


def test_a_failed_execute_is_answered_by_the_io_run_after_its_abort_window_opened() -> None:
    """stop_on_error: the requests already queued (here: in the transport,
    drained when the failure is decided) are aborted; a request sent after
    the error reply runs."""

    async def script(rig: Rig) -> None:
        fail = rig.request("execute_request", {"code": "fail"})
        queued = rig.request("execute_request", {"code": "queued"})
        inspect = rig.request("inspect_request", {"code": "x", "cursor_pos": 1})
        rig.transport.pending.extend([queued, None, inspect])  # None: bad input the server dropped
        await rig.core.receive("shell", fail)
        await rig.transport.wait_idle(fail.msg_id, queued.msg_id, inspect.msg_id)
        assert rig.transport.reply_of(fail.msg_id).thread == threading.get_ident()
        aborted = rig.transport.reply_of(queued.msg_id).msg
        assert aborted.content["ename"] == "ExecutionAborted"
        assert aborted.metadata["status"] == "aborted"
        assert rig.transport.reply_of(inspect.msg_id).msg.content["status"] == "ok"  # only executes are aborted
        later = rig.request("execute_request", {"code": "later"}, date=utcnow_iso())
        await rig.core.receive("shell", later)
        await rig.transport.wait_idle(later.msg_id)
        assert rig.interp.ran == ["fail", "later"]

    drive(script)


def test_a_handler_that_raises_gets_an_error_reply_and_idle() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("execute_request", {"code": "crash"})
        await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(msg.msg_id)
        assert rig.transport.shape(msg.msg_id) == ["busy", "execute_reply", "idle"]
        content = rig.transport.reply_of(msg.msg_id).msg.content
        assert (content["status"], content["ename"]) == ("error", "RuntimeError")
        assert "execution_count" not in content  # not counted: the prompt stays empty (control.request_error)
        assert rig.bad_input.statistics().by_kind.get("shell.request_failed") == 1

    drive(script)


def test_content_of_the_wrong_type_is_refused_not_run() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("execute_request", {"code": 5})
        await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(msg.msg_id)
        assert rig.transport.reply_of(msg.msg_id).msg.content["ename"] == "ProtocolError"
        assert rig.interp.ran == []

    drive(script)


@pytest.mark.parametrize(("channel", "msg_type"), [("shell", "frobnicate_request"), ("control", "execute_request")])
def test_unknown_types_get_an_error_reply_naming_them(channel: str, msg_type: str) -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request(msg_type, {"code": "ok"})
        await rig.core.receive(channel, msg)
        await rig.transport.wait_idle(msg.msg_id)
        content = rig.transport.reply_of(msg.msg_id).msg.content
        assert content["ename"] == "UnknownMessageType"
        assert msg_type in content["evalue"]
        assert rig.interp.ran == []

    drive(script)


def test_a_message_that_is_no_request_gets_busy_and_idle_only() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("frobnicate", {})
        await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(msg.msg_id)
        assert rig.transport.shape(msg.msg_id) == ["busy", "idle"]

    drive(script)


# ------------------------------------------------------------------------ control


def test_kernel_info_is_answered_before_the_user_side_is_up() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("kernel_info_request")
        await rig.core.receive("control", msg)
        await rig.transport.wait_idle(msg.msg_id)
        content = rig.transport.reply_of(msg.msg_id).msg.content
        assert content["protocol_version"] == "5.5"
        assert content["implementation"] == "trikernel"
        execute = rig.request("execute_request", {"code": "early"})
        await rig.core.receive("shell", execute)
        await trio.sleep(0.05)
        assert not rig.transport.done(execute.msg_id)  # waits for the interpreter
        rig.core.user_side_ready(rig.interp)
        await rig.transport.wait_idle(execute.msg_id)
        assert rig.interp.ran == ["early"]

    drive(script, ready=False)


def test_control_answers_while_a_cell_runs_and_interrupt_reaches_the_run() -> None:
    async def script(rig: Rig) -> None:
        cell = rig.request("execute_request", {"code": "wait"})
        await rig.core.receive("shell", cell)
        info, interrupt = rig.request("kernel_info_request"), rig.request("interrupt_request")
        await rig.core.receive("control", info)
        await rig.core.receive("control", interrupt)
        await rig.transport.wait_idle(info.msg_id, interrupt.msg_id)
        assert not rig.transport.done(cell.msg_id)
        assert rig.run.interrupts == 1
        rig.interp.release.set()
        await rig.transport.wait_idle(cell.msg_id)

    drive(script)


def test_shutdown_begins_only_once_its_idle_is_queued() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("shutdown_request", {"restart": True})
        await rig.core.receive("control", msg)
        await rig.transport.wait_idle(msg.msg_id)
        assert rig.transport.reply_of(msg.msg_id).msg.content == {"status": "ok", "restart": True}
        assert len(rig.shutdowns) == 1

    drive(script)


def test_comm_messages_run_beside_a_busy_cell() -> None:
    async def script(rig: Rig) -> None:
        cell = rig.request("execute_request", {"code": "wait"})
        await rig.core.receive("shell", cell)
        comm = rig.request("comm_msg", {"comm_id": "c1", "data": {}})
        await rig.core.receive("shell", comm)
        await rig.transport.wait_idle(comm.msg_id)
        assert rig.transport.shape(comm.msg_id) == ["busy", "idle"]
        assert rig.interp.comms == ["c1"]
        assert not rig.transport.done(cell.msg_id)
        rig.interp.release.set()
        await rig.transport.wait_idle(cell.msg_id)

    drive(script)


def test_a_debug_request_without_a_debugger_gets_a_dap_error() -> None:
    async def script(rig: Rig) -> None:
        msg = rig.request("debug_request", {"seq": 7, "type": "request", "command": "initialize"})
        await rig.core.receive("control", msg)
        await rig.transport.wait_idle(msg.msg_id)
        content = rig.transport.reply_of(msg.msg_id).msg.content
        assert (content["success"], content["request_seq"], content["command"]) == (False, 7, "initialize")

    drive(script)


def test_a_debug_request_goes_to_the_debugger_once_the_user_side_is_up() -> None:
    seen: list[dict[str, Any]] = []

    async def debug(request: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return {"seq": 0, "type": "response", "request_seq": request["seq"], "success": True, "command": "x"}

    async def script(rig: Rig) -> None:
        msg = rig.request("debug_request", {"seq": 3, "type": "request", "command": "x"})
        await rig.core.receive("control", msg)
        await trio.sleep(0.05)
        assert seen == []
        rig.core.user_side_ready(rig.interp)
        await rig.transport.wait_idle(msg.msg_id)
        assert rig.transport.reply_of(msg.msg_id).msg.content["success"] is True

    drive(script, ready=False, debug=debug)


# ------------------------------------------------------------------------ subshells


class FakeSubshells:
    """core.interfaces.SubshellRuns with ThreadRuns as subshells."""

    def __init__(self) -> None:
        self.runs: list[Any] = []
        self.forgotten: list[str] = []

    def create(self) -> Any:
        run = ThreadRun()
        run.subshell_id = f"sub-{len(self.runs)}"  # type: ignore[attr-defined]
        run.ready = trio.Event()  # type: ignore[attr-defined]
        run.ended = trio.Event()  # type: ignore[attr-defined]
        run.thread = run._thread  # type: ignore[attr-defined]
        run.ready.set()  # type: ignore[attr-defined]
        self.runs.append(run)
        return run

    def forget(self, subshell_id: str) -> None:
        self.forgotten.append(subshell_id)

    def interrupt_busy(self) -> None:
        pass

    def stop_all(self) -> None:
        pass

    async def wait_stopped(self, grace: float) -> None:
        pass


def test_subshells_are_listed_once_served_on_their_own_run_and_deleted() -> None:
    subshells = FakeSubshells()

    async def script(rig: Rig) -> None:
        create = rig.request("create_subshell_request")
        await rig.core.receive("control", create)
        await rig.transport.wait_idle(create.msg_id)
        sid = rig.transport.reply_of(create.msg_id).msg.content["subshell_id"]
        assert rig.core.subshell_ids() == [sid]
        cell = rig.request("execute_request", {"code": "in subshell"}, subshell_id=sid)
        await rig.core.receive("shell", cell)
        await rig.transport.wait_idle(cell.msg_id)
        assert rig.interp.threads == [subshells.runs[0].ident]
        assert rig.transport.reply_of(cell.msg_id).thread == subshells.runs[0].ident
        delete = rig.request("delete_subshell_request", {"subshell_id": sid})
        await rig.core.receive("control", delete)
        await rig.transport.wait_idle(delete.msg_id)
        assert rig.core.subshell_ids() == []
        assert subshells.forgotten == [sid]
        gone = rig.request("execute_request", {"code": "x"}, subshell_id=sid)
        await rig.core.receive("shell", gone)
        await rig.transport.wait_idle(gone.msg_id)
        assert rig.transport.reply_of(gone.msg_id).msg.content["ename"] == "UnknownSubshellError"
        assert "execution_count" not in rig.transport.reply_of(gone.msg_id).msg.content  # it never ran

    drive(script, subshells=subshells)


def test_without_subshells_create_is_an_error_reply() -> None:
    async def script(rig: Rig) -> None:
        create = rig.request("create_subshell_request")
        await rig.core.receive("control", create)
        await rig.transport.wait_idle(create.msg_id)
        assert rig.transport.reply_of(create.msg_id).msg.content["status"] == "error"

    drive(script)


class IdleSubshell:
    """A subshell's run that is never sent a job: only listed (core.open_lane)."""

    def __init__(self, subshell_id: str):
        self.subshell_id = subshell_id
        self.ready = trio.Event()

    def stop(self) -> None:
        pass


def test_the_drain_at_a_failure_looks_at_no_lane_while_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """stop_on_error drains the shell socket without a checkpoint. It once
    looked at every lane's backlog per message moved: with the fuzzer's
    ~2,000 subshells (bench/fuzz.py) and a shell backlog, control did not
    answer for 5-13 s (py-spy: the io thread in ``Lanes.any_full``). Now it
    only reads ahead; each message finds its lane once, when it is routed.
    Counted, not timed."""
    lanes, queued_n = 300, SHELL_BACKLOG - 56
    looks = 0
    of = Lanes.of

    def counting(self: Lanes, msg: Message) -> SequentialLane | None:
        nonlocal looks
        looks += 1
        return of(self, msg)

    monkeypatch.setattr(Lanes, "of", counting)

    async def script(rig: Rig) -> None:
        for i in range(lanes):
            rig.core.open_lane(IdleSubshell(f"sub-{i}"))  # type: ignore[arg-type]
        fail = rig.request("execute_request", {"code": "fail"})
        queued = [rig.request("execute_request", {"code": f"q{i}"}) for i in range(queued_n)]
        rig.transport.pending.extend(queued)
        await rig.core.receive("shell", fail)
        await rig.transport.wait_idle(fail.msg_id, *(m.msg_id for m in queued))
        aborted = [rig.transport.reply_of(m.msg_id).msg.content.get("ename") for m in queued]
        assert aborted == ["ExecutionAborted"] * queued_n  # every one was drained before the reply
        assert rig.interp.ran == ["fail"]

    drive(script)
    assert looks <= 1 + queued_n, looks  # was (lanes + 1) * queued_n


class SpawnCounter(trio.abc.Instrument):
    """Counts the tasks spawned while it is on."""

    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


def test_what_the_drain_read_is_served_in_arrival_order_without_a_task_per_message() -> None:
    """The drain reads ahead whatever is queued on shell; it once started an
    io-run task per io-lane message it read (no bound, and those replies in
    any order) and handed comm messages over in any order. Now they are
    routed afterwards, in order, before the reader's next message: the
    deprecated kernel_info on shell is answered in arrival order, the comm
    messages reach the interpreter in arrival order, the executes made
    before the error reply are aborted."""
    n = 80
    assert 3 * n <= DRAIN_LIMIT  # all of it read ahead (the rest would wait for the reader)
    counter = SpawnCounter()

    async def script(rig: Rig) -> None:
        fail = rig.request("execute_request", {"code": "fail"})
        burst: list[Message] = []
        for i in range(n):
            burst.append(rig.request("kernel_info_request"))
            burst.append(rig.request("comm_msg", {"comm_id": f"c{i}", "data": {}}))
            burst.append(rig.request("execute_request", {"code": f"q{i}"}))
        rig.transport.pending.extend(burst)
        trio.lowlevel.add_instrument(counter)
        try:
            await rig.core.receive("shell", fail)
            with trio.fail_after(TIMEOUT):  # the error reply left: the drain has read the burst
                while not any(x.kind == "reply" for x in rig.transport.of(fail.msg_id)):
                    await rig.transport.changed()
            later = rig.request("kernel_info_request")  # the reader's next message: after the burst
            await rig.core.receive("shell", later)
            await rig.transport.wait_idle(fail.msg_id, later.msg_id, *(m.msg_id for m in burst))
        finally:
            trio.lowlevel.remove_instrument(counter)
        infos = [m.msg_id for m in burst if m.msg_type == "kernel_info_request"] + [later.msg_id]
        replied = [
            s.msg.parent_header["msg_id"]
            for s in rig.transport.log
            if s.kind == "reply" and s.msg.msg_type == "kernel_info_reply"
        ]
        assert replied == infos
        assert rig.interp.comms == [f"c{i}" for i in range(n)]
        executes = [m for m in burst if m.msg_type == "execute_request"]
        assert {rig.transport.reply_of(m.msg_id).msg.content.get("ename") for m in executes} == {"ExecutionAborted"}
        assert rig.interp.ran == ["fail"]

    drive(script)
    # a task per comm message (each bracketed in its own, one after another) and a
    # few for the rest; before: one more per kernel_info read by the drain
    assert counter.spawned < 2 * n, counter.spawned


def test_concurrent_requests_are_handed_over_in_arrival_order() -> None:
    """A frontend's comm messages reach the interpreter in the order it sent
    them (ipykernel keeps that order). Each was bracketed in an io-run task
    of its own that raced the others to the user run: 594 of 2,000 came out
    of order in a real kernel (tests/test_kernel.py has that case)."""
    n = 300

    async def script(rig: Rig) -> None:
        msgs = [rig.request("comm_msg", {"comm_id": f"c{i}", "data": {}}) for i in range(n)]
        for msg in msgs:
            await rig.core.receive("shell", msg)
        await rig.transport.wait_idle(*(m.msg_id for m in msgs))
        assert rig.interp.comms == [f"c{i}" for i in range(n)]
        assert all(rig.transport.shape(m.msg_id) == ["busy", "idle"] for m in msgs)

    drive(script)


def test_a_sequential_request_is_handed_over_after_the_concurrent_ones_before_it() -> None:
    """A cell sees the comm messages sent before it: an execute_request's job
    reaches the user run after the jobs of the comm messages that came
    before it (the user run keeps that order: test_userrun.py). The two
    backlogs raced: from an idle kernel a cell ran before the comm_msg sent
    before it in 251 of 300 pairs."""
    n = 100

    async def script(rig: Rig) -> None:
        executes = []
        for i in range(n):  # from an idle kernel each time: the pair races
            await rig.core.receive("shell", rig.request("comm_msg", {"comm_id": f"c{i}", "data": {}}))
            executes.append(rig.request("execute_request", {"code": f"e{i}", "silent": False}))
            await rig.core.receive("shell", executes[-1])
            await rig.transport.wait_idle(executes[-1].msg_id)
        assert rig.interp.ran == [f"e{i}" for i in range(n)]

    rig = drive(script)
    handed = rig.run.tasks_before_job
    assert len(handed) == n, handed
    late = [i for i, before in enumerate(handed) if before < i + 1]
    assert late == [], f"{len(late)} of {n} cells handed over before the comm_msg sent before them: {late[:10]}"


# ------------------------------------------------------------------------ no zmq, no IPython

_NO_ZMQ = """
import sys
sys.modules["zmq"] = None      # import zmq fails from here on
sys.modules["IPython"] = None
sys.path.insert(0, sys.argv[1])
import test_core
test_core.test_a_failed_execute_is_answered_by_the_io_run_after_its_abort_window_opened()
test_core.test_subshells_are_listed_once_served_on_their_own_run_and_deleted()
loaded = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in ("zmq", "IPython")]
assert not loaded, loaded
print("core ok without zmq")
"""


def test_the_core_runs_without_zmq_or_ipython() -> None:
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _NO_ZMQ, here], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "core ok without zmq" in out.stdout


# -------------------------------------------------------------------- stop_on_error's window (lanes.AbortWindow)


def _queued(seq: int, sent: float | None, session: str = "s", msg_type: str = "execute_request") -> Queued:
    msg = MessageBuilder().msg(msg_type, {})
    msg.header["session"] = session
    return Queued(msg, seq, 0.0, sent)


def test_the_abort_window_covers_what_was_made_before_the_error_reply_left() -> None:
    """Issue 26: a request made before the error reply left is aborted
    however late it is read; one made after it runs. The client's clock is
    100 s behind the kernel's: only the bound from its own requests counts."""
    clocks = ClientClocks()
    clocks.note("s", 899.9999, 1000.0)  # an earlier request, read 0.1 ms after it was made
    window = AbortWindow.after(_queued(1, 900.0))
    assert window.covers(_queued(2, None, session="other"), clocks)  # the reply has not left: all of them
    assert not window.covers(_queued(2, 900.1, msg_type="complete_request"), clocks)  # only executes
    window.reply_left(upto_seq=3, wall=1000.5)
    assert window.covers(_queued(3, None, session="other"), clocks)  # read before the reply left
    assert window.covers(_queued(4, 900.3), clocks)  # made before it left (900.3 + 100.0001 < 1000.5), read late
    assert not window.covers(_queued(5, None, session="other"), clocks)  # another client's, read after
    assert not window.covers(_queued(6, 900.6), clocks)  # made after the reply left
    assert not window.covers(_queued(7, 900.35), clocks)  # the session's part ended with the first that ran


def test_a_clients_clock_bound_is_the_least_recent_offset() -> None:
    """The least ``now - date`` of the last CLOCK_MEMORY seconds (two buckets)."""
    clocks = ClientClocks()
    assert clocks.bound("s") is None
    clocks.note("s", 10.0, 11.0)
    clocks.note("s", 12.0, 14.0)  # read longer after it was made: the bound stays 1 s
    assert clocks.bound("s") == 1.0
    half = CLOCK_MEMORY / 2
    clocks.note("s", 10.0 + half, 15.0 + half)  # a new bucket; the 1 s is in the one before
    assert clocks.bound("s") == 1.0
    clocks.note("s", 10.0 + 2.2 * half, 16.0 + 2.2 * half)  # another: the 1 s is forgotten
    assert clocks.bound("s") == 5.0
    clocks.note("s", 0.0, 1000.0)  # after a long silence, only the new observation counts
    assert clocks.bound("s") == 1000.0
    clocks.note(None, 0.0, 1.0)  # no session: nothing to remember
    assert clocks.bound(None) is None


def test_a_request_made_after_the_error_reply_left_runs_even_when_the_drain_reads_it() -> None:
    """Issue 26, found in the loaded suite: the shell socket is drained after the error
    reply's send; on a loaded machine that can be late enough to read a request the client
    made after it got the reply (tests/test_trio.py's next cell after an interrupt was
    aborted). Read by the drain (seq <= upto_seq) but dated after the send: it runs, and so
    do that session's later ones; another client's request read by then is still aborted."""
    clocks = ClientClocks()
    clocks.note("s", 899.9999, 1000.0)  # the client's clock is 100 s behind the kernel's
    window = AbortWindow.after(_queued(1, 900.0))
    window.reply_left(upto_seq=5, wall=1000.5)  # the wall time right before the send
    assert window.covers(_queued(2, 900.2), clocks)  # made before the send
    assert window.covers(_queued(3, None, session="other"), clocks)  # read before the drain ended
    assert not window.covers(_queued(4, 900.6), clocks)  # read by the drain, made after the send
    assert not window.covers(_queued(5, None), clocks)  # the session's later requests run too
    assert window.covers(_queued(5, None, session="other"), clocks)
