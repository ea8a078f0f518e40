"""Request dispatch: one table from msg_type to route, one bracket, the lanes.

Runs on: the io thread's trio run. The shell and control channel tasks read
their ROUTER sockets here (the stdin task is stdinbridge.py's); work that
needs IPython is handed to the user run (userrun.py) and awaited.

:data:`ROUTES` maps every ``msg_type`` trikernel serves to a :class:`Route`:
the channels it is accepted on, its lane and its handler, as xeus's
``xkernel_core`` and ipykernel's ``shell_handlers`` do. Lanes:

- ``io``: answered in the io run itself, in arrival order on its channel
  (kernel_info, shutdown, interrupt, usage), so control answers while a cell
  runs and kernel_info answers while IPython is still loading;
- ``sequential``: one at a time, in order, in the user run's main task
  (execute, complete, inspect, is_complete, history);
- ``concurrent``: as tasks of the user nursery, as soon as the user run has
  control (comm_open / comm_msg / comm_close, comm_info), so a widget's
  ``on_msg`` runs while an async cell awaits;
- ``debug``: ``debug_request`` on control, each bracketed in an io-run task
  of its own (at most ``DEBUG_REQUESTS_IN_FLIGHT`` at once; debugger.py), so
  a request that waits on debugpy or on the main thread (the first start)
  never holds up kernel_info or interrupt on control.

Shell requests are served by a :class:`ShellLane`: the main shell's, or a
subshell's when the header carries ``subshell_id`` (JEP 91, subshells.py).
Each lane has its own sequential backlog, abort window and user run (a
subshell's runs on its own thread); an unknown ``subshell_id`` gets an
error reply.

:meth:`Dispatcher.bracket` is the one place that publishes ``status: busy``,
runs the handler, sends the reply and publishes ``status: idle`` (messaging
spec "Kernel status": busy/idle with the request as parent, the reply before
idle) — and publishes idle whatever the handler raised. Every message on
shell or control is bracketed, known or not; an unknown ``*_request`` gets
an error reply naming its type. A message ``--strict`` refused (a
``strict.Refused`` from the parser, whatever its type) takes :data:`REFUSED`:
io lane, an error reply ``ProtocolError`` or, for non-requests, an IOPub
``error``; it is never run.

Replies: a sequential request's reply leaves from the thread that ran it.
When its job returns, that thread (the main thread, or a subshell's) signs
the reply and sends it on the shell ROUTER itself
(``TrioSocket.send_from_thread``, under the socket's lock), then queues
``status: idle`` (``IOPubQueue.send_status_from_thread``), and only then
tells the io run, which no longer has to wake up before the reply can leave
(issue 12). The bracket still decides everything else; it skips the send
and the idle the job already did (``Reply.sent``, ``Reply.idle_sent``).
The io run sends the reply itself when the job raised, for a failed
``execute_request`` (its stop_on_error window must open first), with
``--message-log`` (recorded in the io run only), and when the user thread's
send failed. While a sequential job runs, the iopub task keeps quiet (up to
``iopub.QUIET_WINDOW``, 2 ms, or until a status is queued), so a short
request's ``busy``, ``execute_input`` and ``idle`` leave together after its
reply instead of taking the GIL from the running cell.

``stop_on_error`` (spec "Execute"): when an ``execute_request`` fails, every
``execute_request`` sent before the failure is answered without running —
only execute requests; complete, inspect and the rest are served normally.
:class:`AbortWindow` is the one place that decides which.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from .badinput import BadInputLog, short
from .errors import JobInterrupted, KernelShuttingDown, ProtocolError
from .strict import Refused, refusal
from .userrun import Job, UserRun
from .wire import Message, Signer, serialize, utcnow_iso

if TYPE_CHECKING:
    from .debugger import Debugger
    from .iopub import IOPubQueue
    from .jobs import ShellJobs
    from .messagelog import MessageLog
    from .messages import MessageBuilder
    from .sockets import TrioSocket
    from .subshells import SubshellRegistry
    from .switchinterval import SwitchIntervals

log = logging.getLogger("trikernel.dispatch")

#: Received but not yet started sequential requests, per shell lane (bounded backlog, messages).
SHELL_BACKLOG = 256
#: Seconds a create_subshell_request waits for the new subshell's trio run.
SUBSHELL_START_TIMEOUT = 10.0
#: Seconds a delete_subshell_request of an idle subshell waits for its thread to end.
SUBSHELL_END_WAIT = 2.0
#: Concurrent-lane jobs in flight at once.
CONCURRENT_LIMIT = 64
#: debug_requests served at once (each an io-run task); later ones wait their turn.
DEBUG_REQUESTS_IN_FLIGHT = 16
#: What a job's ``reply`` (_ThreadReply) sent from the thread that ran it:
#: bit flags in ``_ThreadReply.sent`` (and ``Job.replied``).
SENT_REPLY = 1
SENT_IDLE = 2
#: Seconds the bracket waits at most to queue a status message when
#: cancelled (shutdown); the IOPub queue has an overdraft for the io run, so
#: this only bounds a broken queue.
STATUS_DEADLINE = 1.0


class Lane(StrEnum):
    """Where a request is served (module docstring)."""

    IO = "io"
    SEQUENTIAL = "sequential"
    CONCURRENT = "concurrent"
    DEBUG = "debug"


class Reply(NamedTuple):
    """What a handler returns: the reply's ``content`` and ``metadata``,
    ``after``, called once idle is queued (shutdown starts there), and
    ``sent``: the reply already left from the thread that ran the request
    (module docstring, "Replies"); the bracket then only publishes idle."""

    content: dict[str, Any]
    metadata: dict[str, Any] | None = None
    after: Callable[[], None] | None = None
    sent: bool = False
    #: ``status: idle`` was queued after the reply by that thread too
    idle_sent: bool = False


Handler = Callable[["Dispatcher", Message], Awaitable[Reply | None]]


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the dispatch table."""

    channels: frozenset[str]
    lane: Lane
    handler: Handler


@dataclass(slots=True)
class _Queued:
    """A shell request waiting for the sequential lane."""

    msg: Message
    seq: int  # arrival number on the shell channel
    arrived: float  # trio.current_time() when it was read


@dataclass(eq=False)
class ShellLane:
    """One sequential lane of the shell channel (io run): the main shell's
    (``subshell_id`` None) or a subshell's.

    ``send``/``recv``: its backlog (SHELL_BACKLOG); ``user_run``: where its
    jobs run; ``ready``: set once that run takes jobs; ``abort``: its
    stop_on_error window (per subshell, as ipykernel); ``current``: the
    request being served; ``deleted``: delete_subshell_request came — the
    queued requests are answered without running and the lane ends.
    """

    subshell_id: str | None
    user_run: UserRun
    ready: trio.Event
    send: trio.MemorySendChannel[_Queued]
    recv: trio.MemoryReceiveChannel[_Queued]
    abort: AbortWindow = field(default_factory=lambda: AbortWindow())
    current: _Queued | None = None
    deleted: bool = False

    @classmethod
    def open(cls, subshell_id: str | None, user_run: UserRun, ready: trio.Event) -> ShellLane:
        send, recv = trio.open_memory_channel[_Queued](SHELL_BACKLOG)
        return cls(subshell_id, user_run, ready, send, recv)

    @property
    def idle(self) -> bool:
        return self.current is None and self.send.statistics().current_buffer_used == 0

    @property
    def full(self) -> bool:
        return self.send.statistics().current_buffer_used >= SHELL_BACKLOG


#: The shell lane the current io-run task serves (None: the main shell's).
_serving: ContextVar[ShellLane | None] = ContextVar("trikernel_serving_lane", default=None)


@dataclass
class AbortWindow:
    """Which ``execute_request``\\ s a failed execute with ``stop_on_error`` aborts.

    Exactly those sent before the failure (the client could not have seen
    the error yet). Two rules, either is enough:

    1. it had arrived when the failure was decided (``upto_seq``): the shell
       socket is drained at that moment, so everything already delivered
       by libzmq counts;
    2. it comes from the failed request's client session and its header
       ``date`` is earlier than ``sent_before``: the failed request's own
       ``date`` plus the time the kernel spent on it, both on the client's
       clock, so clock skew between client and kernel does not matter. The
       first later-dated request of that session ends this rule.

    Requests sent after the error reply was received are never aborted.
    """

    upto_seq: int = -1
    session: str | None = None
    sent_before: float | None = None  # POSIX seconds on the client's clock

    def covers(self, q: _Queued) -> bool:
        if q.msg.msg_type != "execute_request":
            return False
        if q.seq <= self.upto_seq:
            return True
        if self.session is not None and q.msg.header.get("session") == self.session:
            sent = _posix_time(q.msg.header.get("date"))
            if sent is not None and self.sent_before is not None and sent <= self.sent_before:
                return True
            self.session = None
        return False


def _posix_time(date: Any) -> float | None:
    """POSIX seconds of an ISO 8601 header date (naive = UTC), or None."""
    if not isinstance(date, str):
        return None
    try:
        dt = datetime.fromisoformat(date)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass
class DispatchDeps:
    """What the dispatcher needs (all built before the io run starts).

    - ``builder``, ``signer``: build and sign replies;
    - ``queue``: status and other io-run IOPub messages;
    - ``user_run``: where sequential and concurrent jobs run;
    - ``parse``: frames → Message or None (inbound.py);
    - ``kernel_info``: ``kernel_info_reply`` content;
    - ``request_shutdown``: begins an orderly shutdown (thread-safe);
    - ``bad_input``: counts and logs (rate-limited) what peers got wrong;
    - ``subshells``: the subshell registry (None: subshells not offered);
    - ``message_log``: records every reply sent (``--message-log``), or None;
    - ``debugger``: answers ``debug_request`` (debugger.py), or None: every
      debug request then gets a DAP error response;
    - ``switch``: shortens the thread switch interval while a control
      request is received and answered (switchinterval.py), or None.
    """

    builder: MessageBuilder
    signer: Signer
    queue: IOPubQueue
    user_run: UserRun
    parse: Callable[[str, list[bytes]], Message | None]
    kernel_info: Callable[[], dict[str, Any]]
    request_shutdown: Callable[[], None]
    bad_input: BadInputLog
    sockets: dict[str, TrioSocket] = field(default_factory=dict)
    subshells: SubshellRegistry | None = None
    message_log: MessageLog | None = None
    debugger: Debugger | None = None
    switch: SwitchIntervals | None = None


class _ThreadReply:
    """Sends a sequential request's reply from the thread that ran its job,
    right when the job returns, then queues its ``status: idle``, instead of
    waking the io run to do both (module docstring, "Replies").

    Called (as a Job's ``reply``) in the user run with the job's result;
    returns, and records in ``sent``, SENT_REPLY, with SENT_IDLE when idle
    was queued too (it is not when the IOPub queue has neither credit nor
    overdraft left: the bracket then queues it, waiting), or 0 when it left
    the reply to the io run. ``metadata(content)``: the reply's metadata;
    ``when(content)``: False leaves the reply to the io run (a failed
    execute, whose stop_on_error window must open before its reply leaves).
    ``sent`` is what the io run reads once the job is done: it is set right
    after each send, so an interrupt landing in between cannot make the io
    run send the reply twice.
    """

    __slots__ = ("_builder", "_metadata", "_msg", "_queue", "_signer", "_sock", "_token", "_when", "sent")

    def __init__(
        self,
        msg: Message,
        metadata: Callable[[dict[str, Any]], dict[str, Any]] | None,
        when: Callable[[dict[str, Any]], bool] | None,
        sock: TrioSocket,
        token: trio.lowlevel.TrioToken,
        builder: MessageBuilder,
        signer: Signer,
        queue: IOPubQueue,
    ):
        self._msg, self._metadata, self._when = msg, metadata, when
        self._sock, self._token = sock, token
        self._builder, self._signer, self._queue = builder, signer, queue
        self.sent = 0

    def __call__(self, content: Any) -> int:
        if not isinstance(content, dict) or (self._when is not None and not self._when(content)):
            return 0
        msg, builder = self._msg, self._builder
        metadata = self._metadata(content) if self._metadata is not None else None
        reply = builder.reply(msg, content, metadata=metadata)
        self._sock.send_from_thread(serialize(reply, self._signer), self._token)  # or undeliverable: counted, logged
        self.sent = SENT_REPLY
        try:
            idle = self._queue.send_status_from_thread(builder.status("idle", msg.header))
        except Exception:  # a bug: the reply is out, so the bracket publishes idle
            log.exception("idle could not be queued from the user run")
            idle = False
        if idle:
            self.sent |= SENT_IDLE
        return self.sent


class Dispatcher:
    """Serves the shell and control channels (io run only)."""

    def __init__(self, deps: DispatchDeps):
        self._d = deps
        self._jobs: ShellJobs | None = None
        self._jobs_ready = trio.Event()
        self._shell_seq = 0
        self._main_lane = ShellLane.open(None, deps.user_run, self._jobs_ready)
        self._lanes: dict[str, ShellLane] = {}  # subshell lanes by subshell_id
        self._limiter = trio.CapacityLimiter(CONCURRENT_LIMIT)
        self._debug_limiter = trio.CapacityLimiter(DEBUG_REQUESTS_IN_FLIGHT)
        self._nursery: trio.Nursery | None = None
        self._processes: dict[int, Any] = {}  # psutil.Process by pid, for usage_request

    # -- wiring ------------------------------------------------------------------
    def user_side_ready(self, jobs: ShellJobs) -> None:
        """The user run is up (io run; called through its token)."""
        self._jobs = jobs
        self._jobs_ready.set()

    async def serve(self, channel: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The channel task of ``channel`` ("shell" or "control"): read,
        parse and route every message until cancelled."""
        sock = self._d.sockets[channel]
        switch = self._d.switch if channel == "control" else None
        if switch is not None:
            sock.on_wake = switch.shorten  # before the frames are received (switchinterval.py)
            sock.on_empty_wake = switch.restore
        async with trio.open_nursery() as nursery:
            if channel == "shell":
                self._nursery = nursery
                nursery.start_soon(self._sequential_lane, self._main_lane)
            task_status.started()
            while True:
                try:
                    # no local keeps a message alive between two receives: a
                    # dropped 64 MiB frame is freed at once, not at the next message
                    await self._route(channel, await sock.recv_multipart(), nursery)
                finally:
                    if switch is not None:
                        switch.restore()

    async def _route(self, channel: str, frames: list[bytes], nursery: trio.Nursery) -> None:
        msg = self._d.parse(channel, frames)
        del frames
        if msg is None:
            return
        route = REFUSED if isinstance(msg, Refused) else self.route_of(channel, msg.msg_type)
        if route.lane is Lane.IO:
            await self.bracket(channel, msg, route.handler)
            return
        if route.lane is Lane.DEBUG:
            borrower = object()
            await self._debug_limiter.acquire_on_behalf_of(borrower)
            nursery.start_soon(self._debug_task, channel, msg, route, borrower)
            return
        lane = self.lane_of(msg)
        if lane is None:
            await self.bracket(channel, msg, _unknown_subshell)
        elif route.lane is Lane.SEQUENTIAL:
            try:
                await lane.send.send(self._arrival(msg))
            except trio.ClosedResourceError:  # deleted while this waited for room
                await self.bracket(channel, msg, _subshell_deleted)
        else:
            borrower = object()
            await self._limiter.acquire_on_behalf_of(borrower)
            nursery.start_soon(self._concurrent, channel, msg, route, borrower, lane)

    def route_of(self, channel: str, msg_type: str) -> Route:
        """The route of ``msg_type`` on ``channel``; unknown types (or known
        ones on a channel that does not take them) get :data:`UNKNOWN`."""
        route = ROUTES.get(msg_type)
        if route is None or channel not in route.channels:
            return UNKNOWN
        return route

    def lane_of(self, msg: Message) -> ShellLane | None:
        """The shell lane ``msg`` goes to: by ``header.subshell_id`` (JEP 91),
        the main shell's when absent or null; None for an unknown id."""
        subshell_id = msg.header.get("subshell_id")
        if subshell_id is None:
            return self._main_lane
        return self._lanes.get(subshell_id) if isinstance(subshell_id, str) else None

    def _arrival(self, msg: Message) -> _Queued:
        self._shell_seq += 1
        return _Queued(msg, self._shell_seq, trio.current_time())

    # -- the bracket -------------------------------------------------------------
    async def bracket(self, channel: str, msg: Message, handler: Handler) -> None:
        """busy → handler → reply → idle, with ``msg`` as parent.

        Idle is published whatever the handler raised (shielded, bounded by
        STATUS_DEADLINE when cancelled). A handler error on a request
        becomes an error reply (``ename``/``evalue`` of the error, logged
        with its traceback unless it is an interrupt or shutdown).
        Messages without a reply (comm messages) return None.
        """
        reply: Reply | None = None
        await self._status("busy", msg)
        try:
            try:
                reply = await handler(self, msg)
            except (JobInterrupted, KernelShuttingDown) as exc:
                log.info("%s %s: %s", channel, msg.msg_type, exc)
                reply = self._error_reply(msg, exc)
            except ProtocolError as exc:  # content of the wrong shape (comms.check_content)
                self._d.bad_input.record(channel, exc.kind, str(exc))
                reply = self._error_reply(msg, exc)
            except Exception as exc:  # odd content (history n="x") or a bug: never ends the channel task
                # counted and logged at a bounded rate (a peer could repeat it
                # forever); the traceback at debug level
                log.debug("%s: %s failed", channel, msg.msg_type, exc_info=True)
                self._d.bad_input.record(
                    channel, "request_failed", f"{msg.msg_type} failed: {type(exc).__name__}: {short(str(exc))}"
                )
                reply = self._error_reply(msg, exc)
            if reply is not None and not reply.sent:
                await self.send(channel, self._d.builder.reply(msg, reply.content, metadata=reply.metadata))
        finally:
            if reply is None or not reply.idle_sent:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + STATUS_DEADLINE
                    await self._status("idle", msg)
        if reply is not None and reply.after is not None:
            reply.after()

    def _error_reply(self, msg: Message, exc: BaseException) -> Reply | None:
        if not msg.msg_type.endswith("_request"):
            return None  # comm messages have no reply
        ename = "KeyboardInterrupt" if isinstance(exc, JobInterrupted) else type(exc).__name__
        content: dict[str, Any] = {"status": "error", "ename": ename, "evalue": str(exc), "traceback": []}
        if msg.msg_type == "execute_request":
            content["execution_count"] = self._jobs.execution_count if self._jobs is not None else 0
        return Reply(content)

    async def _status(self, state: str, msg: Message) -> None:
        await self._d.queue.send(self._d.builder.status(state, msg.header))

    async def send(self, channel: str, msg: Message) -> None:
        """Sign and send ``msg`` on ``channel`` (never blocks: ROUTER)."""
        frames = serialize(msg, self._d.signer)
        delivered = self._d.sockets[channel].send_nowait(frames)
        if self._d.message_log is not None:
            self._d.message_log.record("out", channel, frames, None if delivered else {"undelivered": True})

    # -- lanes -------------------------------------------------------------------
    async def _sequential_lane(self, lane: ShellLane) -> None:
        """Serve ``lane``'s backlog one request at a time; a subshell's lane
        ends when it is deleted (after the request it is serving, the queued
        ones answered unrun), then its user run is stopped."""
        _serving.set(lane)
        try:
            async for q in lane.recv:
                route = self.route_of("shell", q.msg.msg_type)
                if lane.deleted:
                    handler: Handler = _subshell_deleted
                else:
                    handler = _aborted if lane.abort.covers(q) else route.handler
                lane.current = q
                try:
                    await self.bracket("shell", q.msg, handler)
                finally:
                    lane.current = None
        finally:
            if lane.subshell_id is not None:
                lane.user_run.stop()

    async def _concurrent(self, channel: str, msg: Message, route: Route, borrower: object, lane: ShellLane) -> None:
        _serving.set(lane)
        try:
            await self.bracket(channel, msg, route.handler)
        finally:
            self._limiter.release_on_behalf_of(borrower)

    async def _debug_task(self, channel: str, msg: Message, route: Route, borrower: object) -> None:
        try:
            await self.bracket(channel, msg, route.handler)
        finally:
            self._debug_limiter.release_on_behalf_of(borrower)

    async def in_user_run(self, fn: Callable[[], Awaitable[Any]], *, concurrent: bool = False) -> Any:
        """Run ``fn`` in the user run (main thread) and return its result here.

        Waits for the user side to be up first. Raises JobInterrupted if the
        job ended with KeyboardInterrupt (never re-raised in the io run: it
        would end it), KernelShuttingDown if the user run is gone, else
        whatever the job raised.
        """
        return (await self._run_job(fn, concurrent=concurrent)).result

    async def _run_job(
        self, fn: Callable[[], Awaitable[Any]], *, concurrent: bool = False, reply: Callable[[Any], int] | None = None
    ) -> Job:
        """:meth:`in_user_run`, returning the finished Job (``reply``: see
        :class:`~trikernel.userrun.Job`; with a :class:`_ThreadReply`, its
        ``sent`` says what left from the user run)."""
        await _when_set(self._jobs_ready)
        lane = _serving.get() or self._main_lane  # the main shell's outside the shell lanes
        await _when_set(lane.ready)
        job = Job(fn, reply)
        if concurrent:
            lane.user_run.start_task_soon(job)
            await job.done.wait()
        else:
            self._d.queue.quiet()  # until its idle (iopub.QUIET_WINDOW)
            lane.user_run.start_job_soon(job)
            await job.done.wait()
        if isinstance(job.error, KeyboardInterrupt):
            raise JobInterrupted(f"interrupted: {job.error!r}")
        if job.error is not None:
            raise job.error
        return job

    def _reply_from_user_run(
        self,
        msg: Message,
        metadata: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> _ThreadReply | None:
        """The ``reply`` of a sequential shell job (module docstring,
        "Replies"); None with ``--message-log`` (the log is recorded in the
        io run only). Called in the io run; the result runs in the user run."""
        if self._d.message_log is not None:
            return None
        return _ThreadReply(
            msg,
            metadata,
            when,
            self._d.sockets["shell"],
            trio.lowlevel.current_trio_token(),
            self._d.builder,
            self._d.signer,
            self._d.queue,
        )

    def _start_abort(self, lane: ShellLane, failed: _Queued) -> None:
        """stop_on_error: open ``lane``'s abort window for ``failed`` (before
        its reply leaves, so nothing sent after the client saw it is covered)."""
        self._drain_shell()
        sent = _posix_time(failed.msg.header.get("date"))
        spent = trio.current_time() - failed.arrived
        log.debug(
            "stop_on_error: aborting execute requests up to #%d, and of session %s sent before %s (+%.4fs)",
            self._shell_seq,
            failed.msg.header.get("session"),
            failed.msg.header.get("date"),
            spent,
        )
        lane.abort = AbortWindow(
            upto_seq=self._shell_seq,
            session=failed.msg.header.get("session") if sent is not None else None,
            sent_before=sent + spent if sent is not None else None,
        )

    def _drain_shell(self) -> None:
        """Move every message already in the shell socket into the lanes, without
        waiting (stops early when any lane's sequential backlog is full)."""
        sock = self._d.sockets["shell"]
        assert self._nursery is not None
        while not (self._main_lane.full or any(lane.full for lane in self._lanes.values())):
            frames = sock.recv_multipart_nowait()
            if frames is None:
                return
            msg = self._d.parse("shell", frames)
            del frames
            if msg is None:
                continue
            route = REFUSED if isinstance(msg, Refused) else self.route_of("shell", msg.msg_type)
            lane = self.lane_of(msg) if route.lane is not Lane.IO else None
            if route.lane is Lane.IO:
                self._nursery.start_soon(self.bracket, "shell", msg, route.handler)
            elif lane is None:
                self._nursery.start_soon(self.bracket, "shell", msg, _unknown_subshell)
            elif route.lane is Lane.SEQUENTIAL:
                lane.send.send_nowait(self._arrival(msg))
            else:
                self._nursery.start_soon(self._concurrent_waiting, msg, route, lane)

    async def _concurrent_waiting(self, msg: Message, route: Route, lane: ShellLane) -> None:
        borrower = object()
        await self._limiter.acquire_on_behalf_of(borrower)
        await self._concurrent("shell", msg, route, borrower, lane)

    # -- handlers: io lane -------------------------------------------------------
    async def kernel_info(self, msg: Message) -> Reply:
        return Reply(self._d.kernel_info())

    async def shutdown(self, msg: Message) -> Reply:
        restart = _flag(msg.content, "restart", False)
        return Reply({"status": "ok", "restart": restart}, after=self._d.request_shutdown)

    async def interrupt(self, msg: Message) -> Reply:
        """The kernel's interrupt (JEP 91: kernel-wide): the main shell's
        running code and, through ``UserRun.on_interrupt`` (as for a
        signal-mode interrupt), every busy subshell's."""
        self._d.user_run.interrupt()
        return Reply({"status": "ok"})

    # -- handlers: subshells (JEP 91), io lane on control -------------------------
    async def create_subshell(self, msg: Message) -> Reply:
        """``create_subshell_request``: a new subshell with its own thread and
        trio run; answered once that run takes requests."""
        registry = self._d.subshells
        if registry is None:
            return _subshell_error("RuntimeError", "this kernel does not offer subshells")
        assert self._nursery is not None, "the shell channel is served before control answers"
        run = registry.create()
        lane = ShellLane.open(run.subshell_id, run, run.ready)
        self._lanes[run.subshell_id] = lane
        self._nursery.start_soon(self._sequential_lane, lane)
        with trio.move_on_after(SUBSHELL_START_TIMEOUT):
            await run.ready.wait()
        if not run.ready.is_set():
            self._drop_lane(run.subshell_id)
            return _subshell_error("RuntimeError", f"the subshell did not start within {SUBSHELL_START_TIMEOUT}s")
        return Reply({"status": "ok", "subshell_id": run.subshell_id})

    async def delete_subshell(self, msg: Message) -> Reply:
        """``delete_subshell_request``: answered at once. The subshell ends
        after the request it is running; requests queued for it get an
        error reply (``SubshellDeleted``). An idle subshell's thread has
        ended when the reply leaves (bounded by SUBSHELL_END_WAIT)."""
        subshell_id = msg.content.get("subshell_id")
        lane = self._lanes.get(subshell_id) if isinstance(subshell_id, str) else None
        if lane is None or self._d.subshells is None:
            return _subshell_error("UnknownSubshellError", f"Unknown subshell_id {subshell_id!r}")
        idle = lane.idle
        run = self._drop_lane(lane.subshell_id)
        if idle and run is not None:
            with trio.move_on_after(SUBSHELL_END_WAIT):
                await run.ended.wait()
                # ended is set from the thread's last lines, which may not have
                # run yet (threading.active_count() still counts it): no event
                # marks a thread's exit, so join it in a worker thread
                await trio.to_thread.run_sync(run.thread.join, SUBSHELL_END_WAIT, abandon_on_cancel=True)
        return Reply({"status": "ok"})

    async def list_subshell(self, msg: Message) -> Reply:
        """``list_subshell_request``: the ids of the subshells (not the main
        shell's), in creation order."""
        return Reply({"status": "ok", "subshell_id": list(self._lanes)})

    def _drop_lane(self, subshell_id: str | None) -> Any:
        lane = self._lanes.pop(subshell_id, None) if subshell_id is not None else None
        registry = self._d.subshells
        run = registry.remove(subshell_id) if registry is not None and subshell_id is not None else None
        if lane is not None:
            lane.deleted = True
            lane.send.close()  # the lane task ends after its backlog, then stops the run
        return run

    async def usage(self, msg: Message) -> Reply:
        """``usage_request`` (ipykernel 7, read by jupyter-resource-usage):
        hostname, pid, cpu_count, and with psutil installed the CPU percent
        and memory (PSS where the OS has it, else RSS, bytes) of the kernel
        and its children, the host's CPU percent and virtual memory."""
        return Reply(await trio.to_thread.run_sync(self._usage))

    def _usage(self) -> dict[str, Any]:
        content: dict[str, Any] = {"status": "ok", "hostname": socket.gethostname(), "pid": os.getpid()}
        try:
            import psutil
        except ImportError:
            content["cpu_count"] = os.cpu_count()
            return content
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        # keep Process objects between requests: cpu_percent() measures since the last call
        self._processes = {p.pid: self._processes.get(p.pid, p) for p in procs}
        cpu = mem = 0.0
        for p in self._processes.values():
            try:
                cpu += p.cpu_percent(None)
                info = p.memory_full_info()
                mem += getattr(info, "pss", info.rss)
            except psutil.Error:
                continue
        content["kernel_cpu"] = cpu
        content["kernel_memory"] = int(mem)
        host = psutil.cpu_percent(None)
        if host:
            content["host_cpu_percent"] = host
        content["cpu_count"] = psutil.cpu_count(logical=True)
        content["host_virtual_memory"] = dict(psutil.virtual_memory()._asdict())
        return content

    async def unknown(self, msg: Message) -> Reply | None:
        """Anything not in ROUTES: busy/idle (by the bracket) and, for a
        ``*_request``, an error reply naming the type."""
        self._d.bad_input.record("shell/control", "unknown_msg_type", f"unknown message type {short(msg.msg_type)}")
        if not msg.msg_type.endswith("_request"):
            return None
        return Reply(
            {
                "status": "error",
                "ename": "UnknownMessageType",
                "evalue": f"trikernel does not handle {msg.msg_type!r} on this channel",
                "traceback": [],
            }
        )

    async def refused(self, msg: Message) -> Reply | None:
        """A message ``--strict`` refused (strict.py): not run. A request gets
        an error reply with ``ename: ProtocolError``; anything else (comm
        messages: the spec defines no reply) an IOPub ``error`` parented to it."""
        violations = msg.violations if isinstance(msg, Refused) else ()
        content = refusal(msg.msg_type, violations)
        if msg.msg_type.endswith("_request"):
            reply = _shell_error(self, msg, content["ename"], content["evalue"])
            assert reply is not None
            reply.content["traceback"] = content["traceback"]
            return reply
        await self._d.queue.send(self._d.builder.iopub("error", content, msg.header))
        return None

    # -- handlers: user run ------------------------------------------------------
    async def execute(self, msg: Message) -> Reply:
        _check_execute_content(msg.content)
        started = utcnow_iso()
        engine = self._d.builder.session_id
        jobs = await self._jobs_when_ready()

        def metadata(content: dict[str, Any]) -> dict[str, Any]:
            return {"started": started, "dependencies_met": True, "engine": engine, "status": content.get("status")}

        thread_reply = self._reply_from_user_run(msg, metadata, _execute_succeeded)
        job = await self._run_job(lambda: jobs.execute(msg), reply=thread_reply)
        content: dict[str, Any] = job.result
        sent = thread_reply.sent if thread_reply is not None else 0
        if sent:
            return Reply(content, sent=True, idle_sent=bool(sent & SENT_IDLE))
        failed = content.get("status") == "error"
        if failed and _flag(msg.content, "stop_on_error", True) and not _flag(msg.content, "silent", False):
            lane = _serving.get()
            if lane is not None and lane.current is not None and lane.current.msg is msg:
                self._start_abort(lane, lane.current)
        return Reply(content, metadata(content))

    async def comm(self, msg: Message) -> None:
        jobs = await self._jobs_when_ready()
        await self.in_user_run(_sync(jobs.comm, msg), concurrent=True)

    # -- handlers: debugger (lane debug, on control) -----------------------------------
    async def debug(self, msg: Message) -> Reply:
        """``debug_request``: the reply content is the DAP response
        (messaging spec "Debug request"; debugger.py). Waits for IPython to
        be loaded first (the variables live there)."""
        debugger = self._d.debugger
        if debugger is None:
            return Reply(_dap_error(msg.content, "this kernel has no debugger"))
        jobs = await self._jobs_when_ready()
        return Reply(await debugger.handle(msg.content, msg.header, jobs.shell))

    async def _jobs_when_ready(self) -> ShellJobs:
        await _when_set(self._jobs_ready)
        assert self._jobs is not None
        return self._jobs


async def _when_set(event: trio.Event) -> None:
    """Wait for ``event``, without a checkpoint when it is set already.

    ``Event.wait()`` yields even for a set event; on the path of every
    request that let the iopub task send ``busy`` before the job was handed
    to the user run. Traced in one ``execute_request``: busy to hand-over
    140 -> 40 us; the round trip moved within noise (the main thread now
    shares the GIL with that send), inspect 3-4 % (issue 12). A cancelled
    caller still raises Cancelled here (``checkpoint_if_cancelled``), so no
    job is handed over that nobody would wait for.
    """
    if event.is_set():
        await trio.lowlevel.checkpoint_if_cancelled()
    else:
        await event.wait()


async def _aborted(d: Dispatcher, msg: Message) -> Reply:
    """An execute_request not run because an earlier one failed (stop_on_error).

    An ``error`` reply with ename ``ExecutionAborted``: the ``aborted`` status
    is deprecated since spec 5.1, which asks kernels for an error reply; the
    metadata says ``status: aborted`` as ipykernel's does.
    """
    jobs = d._jobs
    content: dict[str, Any] = {
        "status": "error",
        "ename": "ExecutionAborted",
        "evalue": "not run: an earlier request failed with stop_on_error set",
        "traceback": [],
        "execution_count": jobs.execution_count if jobs is not None else 0,
    }
    metadata = {"status": "aborted", "engine": d._d.builder.session_id, "dependencies_met": True}
    return Reply(content, metadata)


def _dap_error(request: dict[str, Any], message: str) -> dict[str, Any]:
    """A DAP error response to ``request`` (DAP "Response", ``success`` false)."""
    seq = request.get("seq")
    return {
        "seq": 0,
        "type": "response",
        "request_seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        "success": False,
        "command": str(request.get("command", "")),
        "message": message,
    }


def _subshell_error(ename: str, evalue: str) -> Reply:
    return Reply({"status": "error", "ename": ename, "evalue": evalue, "traceback": []})


def _shell_error(d: Dispatcher, msg: Message, ename: str, evalue: str) -> Reply | None:
    """An error reply to a shell request that was not run (None for comm messages)."""
    if not msg.msg_type.endswith("_request"):
        return None
    reply = _subshell_error(ename, evalue)
    if msg.msg_type == "execute_request":
        reply.content["execution_count"] = d._jobs.execution_count if d._jobs is not None else 0
    return reply


async def _unknown_subshell(d: Dispatcher, msg: Message) -> Reply | None:
    """A shell message for a ``subshell_id`` that names no subshell (JEP 91:
    an error). Requests get an error reply; every message gets busy/idle."""
    subshell_id = msg.header.get("subshell_id")
    log.info("%s for unknown subshell %s", msg.msg_type, short(repr(subshell_id)))
    return _shell_error(d, msg, "UnknownSubshellError", f"Unknown subshell_id {subshell_id!r}")


async def _subshell_deleted(d: Dispatcher, msg: Message) -> Reply | None:
    """A request queued for a subshell that was deleted before it ran."""
    subshell_id = msg.header.get("subshell_id")
    return _shell_error(d, msg, "SubshellDeleted", f"subshell {subshell_id!r} was deleted before this request ran")


def _user_request(
    body: Callable[[ShellJobs], Callable[[Message], dict[str, Any]]], *, concurrent: bool = False
) -> Handler:
    """The handler of a request whose reply content is one synchronous job
    body of :class:`ShellJobs` run in the user run (``body(jobs)(msg)``);
    ``concurrent``: as a task of the user nursery, not in the sequential lane."""

    async def handler(d: Dispatcher, msg: Message) -> Reply:
        jobs = await d._jobs_when_ready()
        thread_reply = None if concurrent else d._reply_from_user_run(msg)
        job = await d._run_job(_sync(body(jobs), msg), concurrent=concurrent, reply=thread_reply)
        sent = thread_reply.sent if thread_reply is not None else 0
        return Reply(job.result, sent=bool(sent), idle_sent=bool(sent & SENT_IDLE))

    return handler


def _execute_succeeded(content: dict[str, Any]) -> bool:
    """Only a succeeded execute's reply may leave from the user run: a failed
    one opens the stop_on_error window first (io run, :class:`AbortWindow`)."""
    return content.get("status") == "ok"


def _sync(fn: Callable[[Message], Any], msg: Message) -> Callable[[], Awaitable[Any]]:
    """An async job body that calls the synchronous ``fn(msg)``."""

    async def run() -> Any:
        return fn(msg)

    return run


#: execute_request's boolean fields (spec "Execute"); 0 and 1 pass as bools
_EXECUTE_FLAGS = ("silent", "store_history", "allow_stdin", "stop_on_error")


def _check_execute_content(content: dict[str, Any]) -> None:
    """Refuse what would otherwise be coerced and run: ``code`` that is not a
    string (``5`` ran as ``"5"``), a flag that is not a boolean (``"false"``
    was true). Raises ProtocolError (kind "bad_content"): an error reply,
    counted; ipykernel answers such requests with an error too."""
    code = content.get("code", "")
    if not isinstance(code, str):
        raise ProtocolError(f"execute_request: code must be a string, got {type(code).__name__}", "bad_content")
    for name in _EXECUTE_FLAGS:
        value = content.get(name)
        if value is not None and not isinstance(value, (bool, int)):
            raise ProtocolError(f"execute_request: {name} must be a boolean, got {type(value).__name__}", "bad_content")


def _flag(content: dict[str, Any], name: str, default: bool) -> bool:
    value = content.get(name, default)
    return value if isinstance(value, bool) else bool(value)


_SHELL = frozenset({"shell"})
_CONTROL = frozenset({"control"})
_BOTH = frozenset({"shell", "control"})

#: The dispatch table: every message type trikernel serves (messaging spec 5.5).
#: kernel_info, shutdown and interrupt are accepted on shell too (deprecated
#: forms, answered on the channel they came from).
ROUTES: dict[str, Route] = {
    "execute_request": Route(_SHELL, Lane.SEQUENTIAL, Dispatcher.execute),
    "complete_request": Route(_SHELL, Lane.SEQUENTIAL, _user_request(lambda jobs: jobs.complete)),
    "inspect_request": Route(_SHELL, Lane.SEQUENTIAL, _user_request(lambda jobs: jobs.inspect)),
    "is_complete_request": Route(_SHELL, Lane.SEQUENTIAL, _user_request(lambda jobs: jobs.is_complete)),
    "history_request": Route(_SHELL, Lane.SEQUENTIAL, _user_request(lambda jobs: jobs.history)),
    "comm_open": Route(_SHELL, Lane.CONCURRENT, Dispatcher.comm),
    "comm_msg": Route(_SHELL, Lane.CONCURRENT, Dispatcher.comm),
    "comm_close": Route(_SHELL, Lane.CONCURRENT, Dispatcher.comm),
    "comm_info_request": Route(_SHELL, Lane.CONCURRENT, _user_request(lambda jobs: jobs.comm_info, concurrent=True)),
    "kernel_info_request": Route(_BOTH, Lane.IO, Dispatcher.kernel_info),
    "shutdown_request": Route(_BOTH, Lane.IO, Dispatcher.shutdown),
    "interrupt_request": Route(_BOTH, Lane.IO, Dispatcher.interrupt),
    "usage_request": Route(_CONTROL, Lane.IO, Dispatcher.usage),
    "create_subshell_request": Route(_CONTROL, Lane.IO, Dispatcher.create_subshell),
    "delete_subshell_request": Route(_CONTROL, Lane.IO, Dispatcher.delete_subshell),
    "list_subshell_request": Route(_CONTROL, Lane.IO, Dispatcher.list_subshell),
    "debug_request": Route(_CONTROL, Lane.DEBUG, Dispatcher.debug),
}

#: The route of anything not in ROUTES.
UNKNOWN = Route(_BOTH, Lane.IO, Dispatcher.unknown)
#: The route of a message ``--strict`` refused (whatever its type): answered at once, not run.
REFUSED = Route(_BOTH, Lane.IO, Dispatcher.refused)
