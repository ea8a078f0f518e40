"""The kernel: lifecycle, the io thread's tasks, and request dispatch.

Threads (docs/design.md, "Threads and loops"):
- main thread: the user trio run (executor.py) with IPython (shell.py);
- "trikernel-io": one trio run whose root nursery holds the iopub task
  (iopub.py), the shell, control and stdin tasks (below) and the launcher
  watcher;
- "trikernel-heartbeat": the C-level echo (heartbeat.py).

Every request is bracketed by IOPub ``status`` busy/idle with the request as
parent (messaging spec "Kernel status"); the reply goes out before idle.
Shell requests that need IPython run one at a time in order (the
*sequential lane*); comm_open/comm_msg/comm_close run as soon as the user
run gets control (the *concurrent lane*), so ``on_msg`` handlers run while
an async cell awaits. kernel_info is answered by the io thread itself, so it
is answered while IPython is still loading.

A malformed, unsigned or badly signed message is counted and dropped, and
logged at a bounded rate (never its key or content; badinput.py); the
kernel keeps serving.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
import trio.lowlevel

from . import outstream
from .badinput import BadInputLog, short
from .config import ConnectionInfo, KernelConfig
from .errors import ProtocolError
from .executor import Executor, Job
from .heartbeat import Heartbeat
from .iopub import IOPubPublisher, IOPubQueue, IOPubStats
from .messages import Session, kernel_info_content
from .sockets import BoundSockets, TrioSocket
from .wire import Message, Signer, deserialize, serialize, utcnow_iso

if TYPE_CHECKING:
    from .shell import TrikernelShell

# IPython and comm are imported on the main thread, inside the user run
# (_setup_user_run), never here: the io thread must answer kernel_info
# while IPython is still loading (docs/design.md, "Threads and loops").

log = logging.getLogger("trikernel.kernel")

#: Shell requests run in order on the main thread.
SEQUENTIAL = frozenset(
    {"execute_request", "complete_request", "inspect_request", "is_complete_request", "history_request"}
)
#: Frontend comm messages, run concurrently in the user nursery.
CONCURRENT = frozenset({"comm_open", "comm_msg", "comm_close", "comm_info_request"})
#: Received but not yet started sequential requests (bounded backlog).
SHELL_BACKLOG = 256
#: Concurrent-lane jobs in flight at once.
CONCURRENT_LIMIT = 64
#: Seconds the iopub task gets to flush pending messages at shutdown.
FLUSH_TIMEOUT = 5.0


class JobInterrupted(Exception):
    """A job on the main thread ended with KeyboardInterrupt (e.g. an
    interrupted comm handler)."""


def _shell() -> Any:
    """trikernel.shell, imported when a job first needs it (on the main thread)."""
    from . import shell

    return shell


def _comms() -> Any:
    from . import comms

    return comms


class _InputSlot:
    __slots__ = ("event", "msg_id", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: str | None = None
        self.msg_id = ""


class Kernel:
    """One kernel process. Create after binding; call :meth:`run` on the main thread."""

    def __init__(self, conn: ConnectionInfo, config: KernelConfig, bound: BoundSockets, *, iopub_nodrop: bool = True):
        self.conn = conn
        self.iopub_nodrop = iopub_nodrop
        self.config = config
        self.bound = bound
        self.session = Session()
        self.signer = Signer(conn.key, conn.signature_scheme)
        self.limits = config.wire_limits
        self.bad_input = BadInputLog(config.bad_input_log_interval)
        self.stats = IOPubStats()
        self.iopub_queue = IOPubQueue(config.iopub_capacity, config.stream_batch_bytes, self.stats)
        self.parents = outstream.ParentTracker()
        self.executor = Executor()
        self.shell: TrikernelShell | None = None
        self.comm_manager: Any = None
        self.publisher: IOPubPublisher | None = None
        self.exit_code = 0
        self._io_ready = threading.Event()
        self._io_token: trio.lowlevel.TrioToken | None = None
        self._io_nursery: trio.Nursery | None = None
        self._user_ready: trio.Event | None = None
        self._shutdown: trio.Event | None = None
        self._asock: dict[str, TrioSocket] = {}
        self._pending_input: _InputSlot | None = None

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        """Serve until shutdown; returns the process exit code."""
        Heartbeat(self.bound.sockets["hb"]).start()
        io = threading.Thread(target=self._io_thread, name="trikernel-io", daemon=True)
        io.start()
        self._io_ready.wait()
        if self._io_token is None:  # the io run failed to start
            return 1
        try:
            self.executor.run(self._setup_user_run, self._on_user_ready)
        except BaseException:
            log.exception("the user run failed")
            self.exit_code = 1
            raise
        finally:
            if not self.executor.stopping:
                # the user run ended without a shutdown request: shut down
                # cleanly rather than serve requests nobody can run
                log.error("the user run ended unexpectedly; shutting the kernel down")
                self.exit_code = self.exit_code or 1
                self.request_shutdown()
            io.join(self.config.shutdown_grace + FLUSH_TIMEOUT + 2)
            if io.is_alive():
                # the io thread still owns its sockets: closing them under it
                # would be a crash; leave at once instead
                log.error("io thread did not finish; exiting")
                logging.shutdown()
                os._exit(self.exit_code or 1)
            stats = self.stats.as_dict()
            if stats["waits"] or stats["fallback_drops"]:
                log.warning(
                    "iopub at exit: %d waits on full subscribers, %d fallback drops (%s)",
                    stats["waits"],
                    stats["fallback_drops"],
                    stats,
                )
            else:
                log.info("iopub at exit: %s", stats)
            # sockets close with their configured LINGER (flush, bounded)
            self.bound.close()
            self.bound.context.term()
            self.bound.hb_context.term()
        return self.exit_code

    def _setup_user_run(self, nursery: trio.Nursery) -> None:
        """Main thread, inside the user run: install streams, comm, IPython."""
        import trikernel

        from . import comms as comms_mod
        from . import shell as shell_mod

        publisher = outstream.Publisher(self.session, self.signer, self.iopub_queue, self.parents)
        self.comm_manager = comms_mod.install(publisher)
        # Threads IPython starts (history saver) inherit this mask: SIGINT
        # must reach the main thread, where user code runs.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.shell = shell_mod.create_shell(publisher)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        comms_mod.set_shell(self.shell)
        self.shell.kernel = self  # ipywidgets and friends look for shell.kernel
        from .usernursery import UserNursery

        un = UserNursery(nursery, self)
        nursery.start_soon(un.host)  # runs before any job: the loop checkpoints first
        trikernel.nursery = un
        self.shell.user_ns["nursery"] = un
        self.shell.user_ns_hidden["nursery"] = un
        from . import magics

        magics.register(self.shell, self)
        outstream.install(self.iopub_queue, self.parents, capture_fds=self.config.capture_fds)

    def _on_user_ready(self) -> None:
        assert self._io_token is not None and self._user_ready is not None
        self._io_token.run_sync_soon(self._user_ready.set)

    # -------------------------------------------------------------- io thread
    def _io_thread(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            trio.run(self._io_main)
        except BaseException:
            log.exception("io thread failed")
            self.exit_code = 1
        finally:
            self._io_ready.set()
            self.executor.stop()
        if not self.executor.stopped.wait(self.config.shutdown_grace):
            # user code does not return: nothing more to wait for
            log.warning("user code did not stop within %.1fs; exiting", self.config.shutdown_grace)
            logging.shutdown()
            os._exit(self.exit_code)

    async def _io_main(self) -> None:
        self._io_token = trio.lowlevel.current_trio_token()
        self._user_ready = trio.Event()
        self._shutdown = trio.Event()
        self.publisher = publisher = IOPubPublisher(
            self.bound.sockets["iopub"],
            self.iopub_queue,
            self.session,
            self.signer,
            send_timeout=self.config.iopub_send_timeout,
            warn_after=self.config.iopub_warn_after,
            nodrop=self.iopub_nodrop,
            bad_input=self.bad_input,
            max_topic_bytes=self.config.max_topic_bytes,
        )
        async with trio.open_nursery() as outer:
            await outer.start(publisher.run)
            await self.iopub_queue.aput(self.session.status("starting", None), self.signer)
            for name in ("shell", "control", "stdin"):
                self._asock[name] = TrioSocket(self.bound.sockets[name], name)
            async with trio.open_nursery() as inner:
                self._io_nursery = inner
                await inner.start(self._control_task)
                await inner.start(self._shell_task)
                await inner.start(self._stdin_task)
                inner.start_soon(self._watch_parent)
                await inner.start(self.bad_input.run)
                self._io_ready.set()
                await self._shutdown.wait()
                await self._stop_user_run()
                inner.cancel_scope.cancel()
            self.iopub_queue.close()
            outer.cancel_scope.deadline = trio.current_time() + FLUSH_TIMEOUT

    async def _stop_user_run(self) -> None:
        self.executor.stop()
        stopped = await trio.to_thread.run_sync(
            self.executor.stopped.wait, self.config.shutdown_grace, abandon_on_cancel=True
        )
        if not stopped and self.executor.busy:
            log.warning("user code still running at shutdown; interrupting it")
            self.interrupt()
            await trio.to_thread.run_sync(self.executor.stopped.wait, 1.0, abandon_on_cancel=True)

    def request_shutdown(self) -> None:
        """Thread-safe: begin an orderly shutdown."""
        if self._io_token is not None and self._shutdown is not None:
            self._io_token.run_sync_soon(self._shutdown.set)

    async def _watch_parent(self) -> None:
        """Exit when the launching process dies (JPY_PARENT_PID, like ipykernel)."""
        raw = os.environ.get("JPY_PARENT_PID", "")
        try:
            ppid = int(raw)
        except ValueError:
            return
        if ppid <= 1:
            return
        assert self._shutdown is not None
        while True:
            await trio.sleep(self.config.parent_poll_interval)
            if os.getppid() != ppid:
                log.warning("launching process %d is gone; shutting down", ppid)
                self._shutdown.set()
                return

    # ------------------------------------------------------------- helpers
    def _parse(self, channel: str, frames: list[bytes]) -> Message | None:
        try:
            msg = deserialize(frames, self.signer, self.limits)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: received %s %s", channel, msg.msg_type, msg.msg_id)
            return msg
        except ProtocolError as exc:  # deserialize raises nothing else
            self.bad_input.record(channel, exc.kind, str(exc))
            return None

    async def _send(self, channel: str, msg: Message) -> None:
        self._asock[channel].send_multipart(serialize(msg, self.signer))

    async def _status(self, state: str, parent: Message) -> None:
        await self.iopub_queue.aput(self.session.status(state, parent), self.signer)

    async def _on_main(self, fn: Callable[[], Awaitable[Any]], *, concurrent: bool = False) -> Any:
        """Run ``fn`` in the user run (main thread); await its result here."""
        assert self._user_ready is not None
        await self._user_ready.wait()
        job = Job(fn)
        try:
            if concurrent:
                self.executor.submit_concurrent(job)
            else:
                self.executor.submit(job)
        except trio.RunFinishedError:
            raise RuntimeError("the kernel is shutting down") from None
        await job.done.wait()
        if isinstance(job.error, KeyboardInterrupt):
            # never re-raise an interrupt in the io run: it would end it
            raise JobInterrupted(f"interrupted: {job.error!r}")
        if job.error is not None:
            raise job.error
        return job.result

    def _with_parent(self, msg: Message, fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
        async def run() -> Any:
            token = outstream.current_parent.set(msg.header)
            try:
                return fn()
            finally:
                outstream.current_parent.reset(token)

        return run

    def _loaded_shell(self) -> TrikernelShell:
        """The IPython shell; jobs run only after it is loaded (_on_main waits)."""
        assert self.shell is not None
        return self.shell

    def interrupt(self) -> None:
        """Deliver SIGINT to the main thread, where user code runs."""
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    # ----------------------------------------------------------- control
    async def _control_task(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = self._asock["control"]
        task_status.started()
        while True:
            frames = await sock.recv_multipart()
            msg = self._parse("control", frames)
            del frames  # a dropped 64 MiB message must not live on until the next one
            if msg is None:
                continue
            await self._handle_control(msg)

    async def _handle_control(self, msg: Message, channel: str = "control") -> None:
        """kernel_info, shutdown, interrupt; the reply goes back on ``channel``
        (control, or shell for the deprecated shell forms)."""
        t = msg.msg_type
        if t == "kernel_info_request":
            await self._bracket(channel, msg, lambda: kernel_info_content())
        elif t == "shutdown_request":
            restart = bool(msg.content.get("restart", False))
            await self._bracket(channel, msg, lambda: {"status": "ok", "restart": restart})
            assert self._shutdown is not None
            self._shutdown.set()
        elif t == "interrupt_request":
            self.interrupt()
            await self._bracket(channel, msg, lambda: {"status": "ok"})
        else:
            self.bad_input.record(channel, "unknown_msg_type", f"unknown message type {short(t)}")

    async def _bracket(self, channel: str, msg: Message, content: Callable[[], dict[str, Any]]) -> None:
        await self._status("busy", msg)
        await self._send(channel, self.session.reply(msg, content()))
        await self._status("idle", msg)

    # ------------------------------------------------------------- shell
    async def _shell_task(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = self._asock["shell"]
        send, recv = trio.open_memory_channel[Message](SHELL_BACKLOG)
        limiter = trio.CapacityLimiter(CONCURRENT_LIMIT)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sequential_pump, recv)
            task_status.started()
            while True:
                frames = await sock.recv_multipart()
                msg = self._parse("shell", frames)
                del frames
                if msg is None:
                    continue
                t = msg.msg_type
                if t in SEQUENTIAL:
                    await send.send(msg)
                elif t in CONCURRENT:
                    borrower = object()
                    await limiter.acquire_on_behalf_of(borrower)
                    nursery.start_soon(self._concurrent, msg, limiter, borrower)
                elif t in ("kernel_info_request", "shutdown_request", "interrupt_request"):
                    await self._handle_control(msg, "shell")
                else:
                    self.bad_input.record("shell", "unknown_msg_type", f"unknown message type {short(t)}")

    async def _concurrent(self, msg: Message, limiter: trio.CapacityLimiter, borrower: object) -> None:
        try:
            await self._status("busy", msg)
            if msg.msg_type == "comm_info_request":
                target = msg.content.get("target_name")
                content = await self._on_main(
                    self._with_parent(msg, lambda: _comms().comm_info(self.comm_manager, target)), concurrent=True
                )
                await self._send("shell", self.session.reply(msg, content))
            else:
                try:
                    await self._on_main(
                        self._with_parent(msg, lambda: _comms().dispatch(self.comm_manager, msg)), concurrent=True
                    )
                except JobInterrupted:
                    log.warning("a %s handler was interrupted", msg.msg_type)
                except ProtocolError as exc:  # content of the wrong shape (comms.check_content)
                    self.bad_input.record("shell", exc.kind, str(exc))
                except Exception:
                    log.exception("comm handler failed for %s", msg.msg_type)
            await self._status("idle", msg)
        finally:
            limiter.release_on_behalf_of(borrower)

    async def _sequential_pump(self, recv: trio.MemoryReceiveChannel[Message]) -> None:
        while True:
            msg = await recv.receive()
            failed = await self._run_sequential(msg)
            if failed:
                await self._abort_queued(recv)

    async def _abort_queued(self, recv: trio.MemoryReceiveChannel[Message]) -> None:
        """stop_on_error: answer every already-queued request without running it.

        The reply is an ``error`` reply with ename ``ExecutionAborted`` (the
        ``aborted`` status is deprecated since spec 5.1, which asks kernels
        for an error reply); its metadata says ``status: aborted``.
        """
        await trio.lowlevel.checkpoint()  # let the shell reader move what already arrived
        while True:
            try:
                msg = recv.receive_nowait()
            except trio.WouldBlock:
                return
            await self._status("busy", msg)
            md = {"status": "aborted", "engine": self.session.session, "dependencies_met": True}
            content: dict[str, Any] = {
                "status": "error",
                "ename": "ExecutionAborted",
                "evalue": "not run: an earlier request failed with stop_on_error set",
                "traceback": [],
            }
            if msg.msg_type == "execute_request" and self.shell is not None:
                content["execution_count"] = self.shell.execution_count
            await self._send("shell", self.session.reply(msg, content, metadata=md))
            await self._status("idle", msg)

    async def _run_sequential(self, msg: Message) -> bool:
        """Handle one sequential request; True if later requests must be aborted."""
        await self._status("busy", msg)
        t = msg.msg_type
        metadata: dict[str, Any] = {}
        abort = False
        try:
            if t == "execute_request":
                started = utcnow_iso()
                content = await self._on_main(self._execute_job(msg))
                metadata = {
                    "started": started,
                    "dependencies_met": True,
                    "engine": self.session.session,
                    "status": content["status"],
                }
                abort = (
                    content["status"] == "error"
                    and bool(msg.content.get("stop_on_error", True))
                    and not bool(msg.content.get("silent", False))
                )
            else:
                name = t[: -len("_request")]  # complete, inspect, is_complete, history
                content = await self._on_main(
                    self._with_parent(msg, lambda: getattr(_shell(), name)(self._loaded_shell(), msg.content))
                )
        except Exception as exc:
            # odd content (history n="x", ...) or a bug: answered with an
            # error reply; counted and rate-limited, traceback at debug level
            log.debug("%s failed", t, exc_info=True)
            self.bad_input.record("shell", "request_failed", f"{t} failed: {type(exc).__name__}: {short(str(exc))}")
            content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            if t == "execute_request":
                content["execution_count"] = self.shell.execution_count if self.shell else 0
        await self._send("shell", self.session.reply(msg, content, metadata=metadata))
        await self._status("idle", msg)
        return abort

    def _execute_job(self, msg: Message) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def run() -> dict[str, Any]:
            shell = self.shell
            assert shell is not None
            token = outstream.current_parent.set(msg.header)
            self.parents.latest = msg.header
            try:
                if not msg.content.get("silent", False):
                    code = msg.content.get("code", "")
                    code = code if isinstance(code, str) else str(code)  # what shell.execute runs
                    shell.publisher.send("execute_input", {"code": code, "execution_count": shell.execution_count})
                return await _shell().execute(shell, msg.content, lambda p, pw: self._request_input(msg, p, pw))
            finally:
                outstream.current_parent.reset(token)

        return run

    # ------------------------------------------------------------- stdin
    def _request_input(self, parent: Message, prompt: str, password: bool) -> str:
        """Main thread: ask the frontend for a line (blocks; interruptible)."""
        slot = _InputSlot()
        assert self._io_token is not None
        self._io_token.run_sync_soon(self._start_input_request, parent, prompt, password, slot)
        try:
            while not slot.event.wait(0.2):
                pass
        except KeyboardInterrupt:
            self._io_token.run_sync_soon(self._cancel_input, slot)
            raise
        value = slot.value or ""
        if value == "\x04":
            raise EOFError("end of input")
        return value

    def _start_input_request(self, parent: Message, prompt: str, password: bool, slot: _InputSlot) -> None:
        msg = self.session.msg(
            "input_request", {"prompt": prompt, "password": password}, parent, identities=parent.identities
        )
        slot.msg_id = msg.msg_id
        self._pending_input = slot
        assert self._io_nursery is not None
        self._io_nursery.start_soon(self._send, "stdin", msg)

    def _cancel_input(self, slot: _InputSlot) -> None:
        if self._pending_input is slot:
            self._pending_input = None

    async def _stdin_task(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = self._asock["stdin"]
        task_status.started()
        while True:
            frames = await sock.recv_multipart()
            msg = self._parse("stdin", frames)
            del frames
            if msg is not None:
                self._on_stdin(msg)
            del msg

    def _on_stdin(self, msg: Message) -> None:
        """An input_reply answers the pending input(); anything else is bad input."""
        if msg.msg_type != "input_reply":
            self.bad_input.record("stdin", "unknown_msg_type", f"unexpected message type {short(msg.msg_type)}")
            return
        slot = self._pending_input
        if slot is None or msg.parent_header.get("msg_id") not in (slot.msg_id, None):
            self.bad_input.record("stdin", "stray_input_reply", "an input_reply that answers no pending request")
            return
        self._pending_input = None
        value = msg.content.get("value", "")
        slot.value = value if isinstance(value, str) else str(value)
        slot.event.set()
