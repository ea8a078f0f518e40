"""The kernel core: routes every message on shell and control, brackets it,
serves the lanes, hands jobs to the user runs. It sees no socket and no IPython.

xeus's cut: the server (``trikernel.server``) reads the sockets and hands
each parsed message to :meth:`KernelCore.receive`; the core answers through
the :class:`~trikernel.core.interfaces.Transport` it was given and runs
request bodies through the :class:`~trikernel.core.interfaces.Interpreter`
in a user run (:class:`~trikernel.core.interfaces.UserRunHandle`). The
table is table.py; the handlers control.py and requests.py; the bracket
context.py; the lanes and the stop_on_error window lanes.py.

``stop_on_error`` (spec "Execute"): when an ``execute_request`` fails, every
``execute_request`` made before the client could see its error reply is
answered without running — only execute requests; complete, inspect and
the rest are served normally.
:class:`~trikernel.core.lanes.AbortWindow` decides which.

Runs on: the io thread's trio run (:meth:`KernelCore.subshell_ids`: any thread).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from trikernel.core import control, requests
from trikernel.core.badinput import short
from trikernel.core.context import RequestContext
from trikernel.core.interfaces import Empty
from trikernel.core.job import Job
from trikernel.core.lanes import AbortWindow, ClientClocks, Lanes, Queued, SequentialLane, posix_time
from trikernel.core.routes import Lane
from trikernel.core.table import REFUSED, route_of
from trikernel.errors import JobFailed, JobInterrupted, KernelShuttingDown, ProtocolError
from trikernel.protocol.strict import Refused

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from trikernel.core.badinput import BadInputLog
    from trikernel.core.context import Reply
    from trikernel.core.interfaces import Interpreter, SubshellRun, SubshellRuns, Transport, UserRunHandle
    from trikernel.core.routes import CoreServices, Route
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Message

log = logging.getLogger("trikernel.dispatch")

#: Concurrent-lane jobs handed over and not yet answered at once (all lanes).
CONCURRENT_LIMIT = 64
#: Shell messages the stop_on_error drain reads ahead at most (KernelCore._drain_shell).
DRAIN_LIMIT = 256
#: debug_requests queued for the debug lane (served one at a time, in
#: arrival order); past it the control reader waits (backpressure).
DEBUG_BACKLOG = 64

#: The lane the current io-run task serves (None: none; jobs then go to the main shell's run).
_serving: ContextVar[SequentialLane | None] = ContextVar("trikernel_serving_lane", default=None)
#: Set once the current concurrent request's job was handed to its user run
#: (or the request ended without one): its lane's next request may follow.
_handed_over: ContextVar[trio.Event | None] = ContextVar("trikernel_handed_over", default=None)


@dataclass(slots=True)
class _Parked:
    """A shell message the stop_on_error drain read ahead: its route, its
    header date (POSIX seconds) and, for a sequential request, its arrival
    (``seq`` stamped when it was read)."""

    msg: Message
    route: Route
    sent: float | None
    queued: Queued | None


@dataclass
class CoreDeps:
    """What the core needs (all built before the io run starts).

    - ``builder``: builds replies, status and IOPub messages;
    - ``transport``: the server's sockets (interfaces.Transport);
    - ``main_run``: the main thread's user run;
    - ``kernel_info``: ``kernel_info_reply`` content;
    - ``request_shutdown``: begins an orderly shutdown (thread-safe);
    - ``bad_input``: counts and logs (rate-limited) what peers got wrong;
    - ``subshells``: the subshells' threads (None: subshells not offered);
    - ``debug``: ``debug(request, parent)`` → the DAP response of a
      ``debug_request`` (debug/debugger.py), or None: every debug request
      then gets a DAP error response.
    - ``on_control``: told every message read on control, before it is
      routed (``get_ipython().kernel.get_parent("control")``), or None.
    - ``ports``: the bound ports, ``{"shell_port": n, ...}`` (``connect_reply``).
    """

    builder: MessageBuilder
    transport: Transport
    main_run: UserRunHandle
    kernel_info: Callable[[], dict[str, Any]]
    request_shutdown: Callable[[], None]
    bad_input: BadInputLog
    subshells: SubshellRuns | None = None
    debug: Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
    on_control: Callable[[Message], None] | None = None
    ports: Mapping[str, int] = field(default_factory=dict)


class KernelCore:
    """Routes, brackets and serves every message on shell and control (io run).

    Start :meth:`run` as an io-run service before the channels are read;
    the server then calls :meth:`receive` for each message. Implements
    routes.CoreServices for the handlers.
    """

    def __init__(self, deps: CoreDeps):
        self._d = deps
        self._transport = deps.transport
        self._interp: Interpreter | None = None
        self._ready = trio.Event()
        self._shell_seq = 0
        self.lanes = Lanes(SequentialLane.open(None, deps.main_run, self._ready))
        self.clocks = ClientClocks()  # the clients' clocks, for stop_on_error (lanes.AbortWindow)
        self._limiter = trio.CapacityLimiter(CONCURRENT_LIMIT)
        # the debug lane: one request at a time, FIFO (ipykernel#1412: two
        # variables requests bracketed at once gave busy, busy, idle, idle)
        self._debug_send: trio.MemorySendChannel[tuple[str, Message, Route]]
        self._debug_recv: trio.MemoryReceiveChannel[tuple[str, Message, Route]]
        self._debug_send, self._debug_recv = trio.open_memory_channel(DEBUG_BACKLOG)
        self._nursery: trio.Nursery | None = None
        # the stop_on_error drain's read-ahead (_drain_shell): routed in
        # order by _serve_parked before the shell reader's next message
        self._parked: deque[_Parked] = deque()
        self._parked_served: trio.Event | None = None  # set when _parked is empty again
        self._shell_routing = False  # receive() is routing a shell message now
        self._shell_routed: trio.Event | None = None  # set when it is done (_serve_parked waits)

    # -- CoreServices ----------------------------------------------------------------
    @property
    def builder(self) -> MessageBuilder:
        """Builds the kernel's messages."""
        return self._d.builder

    @property
    def main_run(self) -> UserRunHandle:
        """The main thread's user run."""
        return self._d.main_run

    @property
    def subshells(self) -> SubshellRuns | None:
        """The subshells' threads, or None."""
        return self._d.subshells

    @property
    def bad_input(self) -> BadInputLog:
        """Counts and logs what peers got wrong."""
        return self._d.bad_input

    def kernel_info(self) -> dict[str, Any]:
        """``kernel_info_reply`` content."""
        return self._d.kernel_info()

    def request_shutdown(self) -> None:
        """Begin an orderly shutdown."""
        self._d.request_shutdown()

    def ports(self) -> dict[str, int]:
        """The bound ports, ``{"shell_port": n, ...}``."""
        return dict(self._d.ports)

    def serving(self) -> SequentialLane | None:
        """The lane the current io-run task serves."""
        return _serving.get()

    async def interpreter(self) -> Interpreter:
        """The interpreter, once the user side is up."""
        await _when_set(self._ready)
        assert self._interp is not None
        return self._interp

    async def publish(self, msg: Message) -> None:
        """Queue an IOPub message."""
        await self._transport.publish(msg)

    async def debug(self, request: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any] | None:
        """The DAP response, once IPython is loaded (the variables live
        there); None when the kernel has no debugger."""
        if self._d.debug is None:
            return None
        await self.interpreter()
        return await self._d.debug(request, parent)

    def open_lane(self, run: SubshellRun) -> SequentialLane:
        """List a new subshell's lane and start its task."""
        assert self._nursery is not None, "the core runs before control is read"
        lane = SequentialLane.open(run.subshell_id, run, run.ready)
        self.lanes.add(lane)
        self._nursery.start_soon(self._serve_lane, lane)
        self._nursery.start_soon(self._serve_concurrent, lane)
        return lane

    def subshell_ids(self) -> list[str]:
        """The subshells' ids in creation order (any thread: ``%subshell``)."""
        return self.lanes.subshell_ids()

    # -- wiring ------------------------------------------------------------------------
    def user_side_ready(self, interpreter: Interpreter) -> None:
        """The user run is up (io run; called through its token)."""
        self._interp = interpreter
        self._ready.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The core's io-run service: holds the nursery of the lanes, the
        concurrent jobs and the debug lane; serves the main lane.

        Cancellation: runs until the io run cancels it at shutdown; every
        bracket in flight still publishes its idle (context.py).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._serve_lane, self.lanes.main)
            nursery.start_soon(self._serve_concurrent, self.lanes.main)
            nursery.start_soon(self._serve_debug)
            task_status.started()
            await trio.sleep_forever()

    # -- routing -----------------------------------------------------------------------
    async def receive(self, channel: str, msg: Message) -> None:
        """Route one parsed message read on ``channel`` ("shell"/"control").

        Waits (backpressure on the reader) only while the target lane's
        backlog is full, for io-lane requests, which are answered right here
        in arrival order, and on shell while messages the stop_on_error drain
        read ahead are still being routed (they were read first).
        """
        assert self._nursery is not None
        if channel == "control" and self._d.on_control is not None:
            self._d.on_control(msg)
        route = REFUSED if isinstance(msg, Refused) else route_of(channel, msg.msg_type)
        sent = self._clock(msg)
        if channel != "shell":
            await self._route(channel, msg, route, sent)
            return
        if self._parked_served is not None:
            await self._parked_served.wait()
        self._shell_routing = True
        try:
            await self._route(channel, msg, route, sent)
        finally:
            self._shell_routing = False
            if self._shell_routed is not None:
                self._shell_routed.set()
                self._shell_routed = None

    async def _route(
        self, channel: str, msg: Message, route: Route, sent: float | None, queued: Queued | None = None
    ) -> None:
        """Hand ``msg`` to its lane, or answer it here (io lane); ``queued``:
        its arrival, when the drain stamped it already."""
        assert self._nursery is not None
        if route.lane is Lane.IO:
            await self.bracket(channel, msg, route.handler)
            return
        if route.lane is Lane.DEBUG:
            await self._debug_send.send((channel, msg, route))
            return
        lane = self.lanes.of(msg)
        if lane is None:
            await self.bracket(channel, msg, requests.unknown_subshell)
            return
        try:
            if route.lane is Lane.SEQUENTIAL:
                q = queued if queued is not None else self._arrival(msg, sent)
                q.concurrent_before = lane.concurrent_routed
                await lane.send.send(q)
            else:
                await lane.concurrent_send.send(msg)
                lane.concurrent_routed += 1
        except trio.ClosedResourceError:  # deleted while this waited for room
            await self.bracket(channel, msg, requests.subshell_deleted)

    def _arrival(self, msg: Message, sent: float | None) -> Queued:
        self._shell_seq += 1
        return Queued(msg, self._shell_seq, trio.current_time(), sent)

    def _clock(self, msg: Message) -> float | None:
        """``msg``'s header date (POSIX seconds, the client's clock), noted
        in the client's clock bound (lanes.ClientClocks); None if it has none."""
        sent = posix_time(msg.header.get("date"))
        if sent is not None:
            self.clocks.note(msg.header.get("session"), sent, time.time())
        return sent

    # -- the bracket ---------------------------------------------------------------------
    async def bracket(
        self,
        channel: str,
        msg: Message,
        handler: Callable[[CoreServices, RequestContext], Awaitable[Reply | None]],
    ) -> None:
        """busy → handler → reply → idle, with ``msg`` as parent (context.py).

        Idle is published whatever the handler raised (shielded, bounded
        when cancelled). A handler error on a request becomes an error reply
        (``ename``/``evalue`` of the error; counted, and logged at debug
        level unless it is an interrupt or shutdown). Messages without a
        reply (comm messages) return None from their handler.
        """
        ctx = RequestContext(self._transport, self._d.builder, channel, msg)
        reply: Reply | None = None
        await ctx.busy()
        try:
            try:
                reply = await handler(self, ctx)
            except (JobInterrupted, KernelShuttingDown) as exc:
                log.info("%s %s: %s", channel, msg.msg_type, exc)
                reply = self._error_reply(msg, exc)
            except ProtocolError as exc:  # content of the wrong shape (comms.check_content)
                self._d.bad_input.record(channel, exc.kind, str(exc))
                reply = self._error_reply(msg, exc)
            except Exception as exc:  # odd content (history n="x") or a bug: never ends the channel task
                # counted and logged at a bounded rate (a peer could repeat it
                # forever); the traceback at debug level (a job's: taken in the user run)
                log.debug("%s: %s failed %s", channel, msg.msg_type, getattr(exc, "detail", ""), exc_info=True)
                self._d.bad_input.record(
                    channel, "request_failed", f"{msg.msg_type} failed: {_ename(exc)}: {short(str(exc))}"
                )
                reply = self._error_reply(msg, exc)
            if reply is not None:
                ctx.reply(reply.content, reply.metadata, on_sent=reply.on_sent)
        finally:
            await ctx.idle()
        if reply is not None and reply.after is not None:
            reply.after()

    def _error_reply(self, msg: Message, exc: BaseException) -> Reply | None:
        ename = "KeyboardInterrupt" if isinstance(exc, JobInterrupted) else _ename(exc)
        return control.request_error(msg.msg_type, ename, str(exc))

    # -- lanes -------------------------------------------------------------------------
    async def _serve_lane(self, lane: SequentialLane) -> None:
        """Serve ``lane``'s backlog one request at a time; a subshell's lane
        ends when it is deleted (after the request it is serving, the queued
        ones answered unrun), then its user run is stopped."""
        _serving.set(lane)
        try:
            async for q in lane.recv:
                handler: Callable[[CoreServices, RequestContext], Awaitable[Reply | None]]
                if lane.deleted:
                    handler = requests.subshell_deleted
                elif lane.abort.covers(q, self.clocks):
                    handler = requests.aborted
                else:
                    handler = route_of("shell", q.msg.msg_type).handler
                lane.current = q
                try:
                    await self.bracket("shell", q.msg, handler)
                finally:
                    lane.current = None
        finally:
            if lane.subshell_id is not None:
                lane.user_run.stop()

    async def _serve_debug(self) -> None:
        """The debug lane: each ``debug_request`` bracketed in turn, in arrival
        order, so each gets busy → reply → idle before the next one's busy
        (JupyterLab's Variables panel reads the statuses). Apart from the io
        lane: a request waiting on debugpy never delays kernel_info or
        interrupt."""
        async for channel, msg, route in self._debug_recv:
            await self.bracket(channel, msg, route.handler)

    async def _serve_concurrent(self, lane: SequentialLane) -> None:
        """Serve ``lane``'s concurrent requests (comm messages, comm_info) in
        arrival order: each is bracketed in a task of its own (so one that
        waits for its user run does not hold up the next one's reply), but
        the next starts only once this one's job was handed over, and the
        user run starts its concurrent jobs in the order it got them
        (``UserRunHandle.start_task_soon``); the lane's sequential requests
        that came after one hand their jobs over after it
        (``SequentialLane.handed_over``). At most CONCURRENT_LIMIT are
        under way at once, all lanes together. A deleted subshell's queued
        requests are answered without running (``subshell_deleted``).

        Cancellation: ends with the core's nursery (shutdown)."""
        assert self._nursery is not None
        _serving.set(lane)
        async for msg in lane.concurrent_recv:
            route = route_of("shell", msg.msg_type)
            if lane.deleted:
                await self.bracket("shell", msg, requests.subshell_deleted)
                lane.one_handed_over()
                continue
            borrower = object()
            await self._limiter.acquire_on_behalf_of(borrower)
            handed_over = trio.Event()
            self._nursery.start_soon(self._concurrent, msg, route, borrower, handed_over)
            await handed_over.wait()
            lane.one_handed_over()  # the lane's sequential requests behind it may hand theirs over

    async def _concurrent(self, msg: Message, route: Route, borrower: object, handed_over: trio.Event) -> None:
        """One concurrent request, bracketed; ``handed_over`` is set once its
        job is in the user run's hands (:meth:`run_job`), or at its end."""
        _handed_over.set(handed_over)
        try:
            await self.bracket("shell", msg, route.handler)
        finally:
            handed_over.set()
            self._limiter.release_on_behalf_of(borrower)

    async def run_job(
        self, fn: Callable[[], Awaitable[Any]], *, concurrent: bool = False, context: RequestContext | None = None
    ) -> Any:
        """Run ``fn`` in the serving lane's user run (the main shell's outside
        the lanes) and return its result here.

        Args:
            fn: the job body (an async callable, run in the user run).
            concurrent: as a task of that run, not in its sequential lane.
            context: the request's context, whose reply may then leave from
                the user run (:meth:`RequestContext.reply_from_thread`).

        Raises:
            JobInterrupted: the job ended with KeyboardInterrupt (never
                re-raised in the io run: it would end it).
            KernelShuttingDown: the user run is gone.
            Exception: whatever the job raised.
        """
        await _when_set(self._ready)
        serving = _serving.get()
        lane = serving or self.lanes.main
        await _when_set(lane.ready)
        job = Job(fn, context)
        if concurrent:
            lane.user_run.start_task_soon(job)
            handed_over = _handed_over.get()
            if handed_over is not None:
                handed_over.set()  # the lane's next concurrent request may follow (_serve_concurrent)
        else:
            # the lane's own sequential request: the comm messages that came before it first (SequentialLane)
            queued = lane.current if serving is lane and _handed_over.get() is None else None
            if queued is not None:
                await lane.handed_over(queued.concurrent_before)
            lane.user_run.start_job_soon(job)
        await job.done.wait()
        if isinstance(job.error, KeyboardInterrupt):
            raise JobInterrupted(f"interrupted: {job.error!r}")
        if job.error is not None:
            raise job.error
        return job.result

    # -- stop_on_error ---------------------------------------------------------------------
    def start_abort(self, lane: SequentialLane, failed: Queued) -> Callable[[float], None]:
        """stop_on_error: open ``lane``'s abort window for ``failed`` (before
        its reply is handed to the transport). Returns the callback for the
        moment the error reply leaves (``Transport.send``'s ``on_sent``):
        the shell socket is drained then, and the window knows its end
        (lanes.AbortWindow)."""
        window = lane.abort = AbortWindow.after(failed)

        def reply_left(sent_at: float) -> None:
            # sent_at: taken before the send, so no request made after the client
            # got the reply is dated before it (the drain may come much later on
            # a loaded machine, and read requests made after the reply arrived)
            self._drain_shell()
            window.reply_left(self._shell_seq, sent_at)
            log.debug(
                "stop_on_error: aborting execute requests up to #%d, and of session %s made before the reply left",
                self._shell_seq,
                window.session,
            )

        return reply_left

    def _drain_shell(self) -> None:
        """Read every message already queued on the shell channel, without
        waiting, and stamp it as arrived (a sequential request gets its
        ``seq`` now, which the abort window compares): at most DRAIN_LIMIT
        read ahead at once. They are routed afterwards, in order, by
        :meth:`_serve_parked`, before the shell reader's next message: a
        kernel_info on shell is still answered in arrival order, a comm
        message still waits for its lane's turn, and no task is started per
        message.

        Cost: one parse per message read; no lane is looked at (the drain
        once looked at every lane per message: with the fuzzer's ~2,000
        subshells control went unanswered for 5-13 s).
        """
        assert self._nursery is not None
        while len(self._parked) < DRAIN_LIMIT:
            msg = self._transport.receive_nowait("shell")
            if isinstance(msg, Empty):
                break
            if msg is None:
                continue
            route = REFUSED if isinstance(msg, Refused) else route_of("shell", msg.msg_type)
            sent = self._clock(msg)
            queued = self._arrival(msg, sent) if route.lane is Lane.SEQUENTIAL else None
            self._parked.append(_Parked(msg, route, sent, queued))
        if self._parked and self._parked_served is None:
            self._parked_served = trio.Event()
            self._nursery.start_soon(self._serve_parked)

    async def _serve_parked(self) -> None:
        """Route what the drain read ahead, in order, after the message the
        shell reader is routing now (read before them); then let the reader
        go on (``_parked_served``)."""
        try:
            if self._shell_routing:
                self._shell_routed = trio.Event()
                await self._shell_routed.wait()
            while self._parked:
                p = self._parked.popleft()
                await self._route("shell", p.msg, p.route, p.sent, p.queued)
        finally:
            served, self._parked_served = self._parked_served, None
            self._parked.clear()  # cancelled at shutdown: nothing is left to route
            if served is not None:
                served.set()


async def _when_set(event: trio.Event) -> None:
    """Wait for ``event``, without a checkpoint when it is set already.

    ``Event.wait()`` yields even for a set event; on the path of every
    request that let the iopub task send ``busy`` before the job was handed
    to the user run. Traced in one ``execute_request``: busy to hand-over
    140 -> 40 us; inspect 3-4 % faster (issue 12). A cancelled caller still
    raises Cancelled here (``checkpoint_if_cancelled``), so no job is handed
    over that nobody would wait for.
    """
    if event.is_set():
        await trio.lowlevel.checkpoint_if_cancelled()
    else:
        await event.wait()


def _ename(exc: BaseException) -> str:
    """The error name a reply gives: a job's own (``JobFailed.ename``), else the exception's type."""
    return exc.ename if isinstance(exc, JobFailed) else type(exc).__name__
