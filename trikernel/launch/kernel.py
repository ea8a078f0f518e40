"""The kernel's lifecycle: build the parts, start the threads, serve, shut down.

Threads (docs/design.md, "Threads and loops"):
- main thread: the user trio run (user/userrun.py) with IPython
  (user/interpreter.py, user/shell.py) — :meth:`Kernel.run` blocks in it;
- "trikernel-io": one trio run (server/iorun.py): the server, owning shell,
  control, stdin and iopub (server/requests.py, stdin.py, iopubtask.py), and
  the core (core/kernelcore.py);
- "trikernel-heartbeat": the C-level echo (server/heartbeat.py).

:class:`Kernel` is created on the main thread after every socket is bound
(launch/cli.py) and holds no request logic; it wires the layers: the server
is the core's ``Transport``, the user side its ``Interpreter``; the path of
a request is server → core (io run) → Job (hand-off) → user/interpreter.py
(user run) → back (docs/design.md, "The path of a request").

Runs on: the main thread (built there; :meth:`Kernel.run` blocks in the
user run); :meth:`Kernel.request_shutdown` and ``iopub_counters`` from any
thread; the debug-request handler in the io run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import trio

from trikernel.core.badinput import BadInputLog
from trikernel.core.kernelcore import CoreDeps, KernelCore
from trikernel.debug.debugger import Debugger, DebuggerDeps
from trikernel.debug.debugger import available as debugger_available
from trikernel.errors import ConfigError
from trikernel.launch.options import EXIT_RUNTIME, fail
from trikernel.protocol.messages import MessageBuilder, kernel_info_content
from trikernel.protocol.wire import Signer
from trikernel.server.heartbeat import Heartbeat
from trikernel.server.inbound import InboundParser
from trikernel.server.iopubqueue import IOPubQueue, IOPubStats
from trikernel.server.iopubtask import IOPubTask
from trikernel.server.iorun import FLUSH_TIMEOUT, IORun, IORunParts
from trikernel.server.requests import RequestServer
from trikernel.server.sockets import BoundSockets, TrioSocket
from trikernel.server.stdin import StdinBridge
from trikernel.server.switchinterval import SwitchIntervals
from trikernel.threads import not_traced
from trikernel.user import collector, fdcapture
from trikernel.user.interpreter import Interpreter, UserSideDeps, set_up
from trikernel.user.outstream import ParentTracker
from trikernel.user.subshells import SubshellRegistry, register_magic
from trikernel.user.userrun import UserRun

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from trikernel.launch.config import KernelConfig
    from trikernel.protocol.connection import ConnectionInfo
    from trikernel.protocol.strict import StrictCheck
    from trikernel.server.iorun import Service
    from trikernel.server.messagelog import MessageLog

# IPython and comm are imported on the main thread, inside the user run
# (interpreter.set_up), never at import time here: the io thread must answer
# kernel_info while IPython is still loading.

log = logging.getLogger("trikernel.kernel")


class Kernel:
    """One kernel process. Create after binding; call :meth:`run` on the main thread.

    ``services``: extra io-run tasks started with ``task_status`` (e.g. the
    gateway comm port), each called as ``service(task_status=...)``.
    ``connection_file``: absolute path of a connection file clients can
    attach with, or None (``%connect_info`` shows it). ``strict``: the
    ``--strict`` check (strict.py), ``message_log``: the ``--message-log``
    writer (messagelog.py), each None when off; both built by cli.py.
    ``ipython_argv``: the IPython options of the command line, checked by
    cli.py before bind (user/ipyoptions.py), read again in the user run
    (user/kernelapp.py).
    """

    def __init__(
        self,
        conn: ConnectionInfo,
        config: KernelConfig,
        bound: BoundSockets,
        *,
        iopub_nodrop: bool = True,
        services: tuple[Service, ...] = (),
        connection_file: str | None = None,
        strict: StrictCheck | None = None,
        message_log: MessageLog | None = None,
        ipython_argv: tuple[str, ...] = (),
    ):
        self.conn = conn
        self.config = config
        self.bound = bound
        self.exit_code = 0
        self.strict = strict
        self.message_log = message_log
        signer = Signer(conn.key, conn.signature_scheme)
        builder = MessageBuilder()
        self.stats = IOPubStats()
        self.queue = IOPubQueue(config.iopub_capacity, config.stream_batch_chars, self.stats, signer)
        self.parents = ParentTracker()
        self.user_run = UserRun()
        self.bad_input = BadInputLog(config.bad_input_log_interval)
        self.subshells = SubshellRegistry()
        self.user_run.on_interrupt = self._interrupt_subshells
        parse = InboundParser(signer, self.bad_input, config.wire_limits, strict=strict, message_log=message_log)
        self.heap = parse.heap
        self.stdin = StdinBridge(builder, parse, iopub=self.queue)
        self.iopub = IOPubTask(
            bound.sockets["iopub"],
            self.queue,
            builder,
            send_timeout=config.iopub_send_timeout,
            warn_after=config.iopub_warn_after,
            nodrop=iopub_nodrop,
            bad_input=self.bad_input,
            max_topic_bytes=config.max_topic_bytes,
            message_log=message_log,
            hold_bytes=config.iopub_hold_bytes,
            monitor=bound.iopub_monitor,
        )
        # debugpy is imported only when a client first turns the debugger on (debug/debugger.py)
        self.debugger = Debugger(DebuggerDeps(builder, self.queue, self.user_run))
        self.requests = RequestServer(
            {name: TrioSocket(bound.sockets[name], name) for name in ("shell", "control")},
            parse,
            self.queue,
            switch=SwitchIntervals(config.control_switch_interval),
        )
        self.core = KernelCore(
            CoreDeps(
                builder=builder,
                transport=self.requests,
                main_run=self.user_run,
                kernel_info=functools.partial(
                    kernel_info_content, debugger=debugger_available(), ipython_version=ipython_version()
                ),
                request_shutdown=self.request_shutdown,
                bad_input=self.bad_input,
                subshells=self.subshells,
                debug=self._debug,
                on_control=self.parents.control_seen,
                ports=conn.ports,
            )
        )
        self.requests.attach(self.core)
        self.io = IORun(
            IORunParts(
                builder,
                self.queue,
                self.iopub,
                self.core,
                self.requests,
                self.stdin,
                TrioSocket(bound.sockets["stdin"], "stdin"),
                self.user_run,
                config.shutdown_grace,
                config.parent_poll_interval,
                (self.bad_input.run, parse.heap.run, self.subshells.serve, self.debugger.serve, *services),
                self.subshells,
            )
        )
        self._user_side = UserSideDeps(
            builder,
            self.queue,
            self.parents,
            self.stdin,
            self.iopub_counters,
            config.capture_fds,
            fd_backlog_bytes=config.fd_backlog_bytes,
            connection=conn,
            connection_file=connection_file,
            message_log=message_log,
            ipython_argv=ipython_argv,
        )
        self._interp: Interpreter | None = None
        self._start_up_failed = False

    def iopub_counters(self) -> dict[str, Any]:
        """The IOPub counters ``%trikernel`` shows (any thread)."""
        stats = self.stats.as_dict()
        stats["iopub_capacity"] = self.queue.capacity
        stats["iopub_queued"] = len(self.queue)
        stats["degraded"] = self.iopub.degraded
        stats["iopub_holding"] = self.iopub.holding
        stats["iopub_connections"] = self.iopub.connections
        stats["iopub_topics"] = self.iopub.subscribers.topics
        stats["iopub_topic_bytes"] = self.iopub.subscribers.topic_bytes
        bad = self.bad_input.statistics()
        stats["malformed_dropped"] = bad.dropped
        stats["malformed_by_kind"] = bad.by_kind
        heap = self.heap.statistics()
        stats["heap_trims"] = heap.trims
        stats["heap_trim_due"] = heap.trim_due
        stats.update({f"fd_{k}": v for k, v in fdcapture.statistics().__dict__.items()})
        if collector.COLLECTOR is not None:
            stats.update({f"gc_{k}": v for k, v in collector.COLLECTOR.statistics.items()})
        stats["strict"] = self.strict is not None
        if self.message_log is not None:
            mlog = self.message_log.statistics()
            stats["message_log"] = mlog.path
            stats["message_log_lines"] = mlog.lines
            stats["message_log_dropped"] = mlog.dropped
            stats["message_log_unwritten"] = mlog.unwritten
        return stats

    def _interrupt_subshells(self) -> None:
        """UserRun.on_interrupt (main thread, maybe in the SIGINT handler):
        the io run interrupts the busy subshells (JEP 91: interrupts are
        kernel-wide) and lets the debugger resume a thread stopped at a
        breakpoint (debugger.py ``after_interrupt``)."""
        with contextlib.suppress(trio.RunFinishedError):  # the io run has ended (shutdown)
            self.io.token.run_sync_soon(self.subshells.interrupt_busy)
            self.io.token.run_sync_soon(self.debugger.after_interrupt)

    def request_shutdown(self) -> None:
        """Begin an orderly shutdown (thread-safe)."""
        self.io.request_shutdown()

    # -- main thread -------------------------------------------------------------
    def run(self) -> int:
        """Serve until shutdown; returns the process exit code."""
        # A cell that computes holds the GIL; the io thread (control, IOPub)
        # gets it after at most this long (docs/benchmarks.md, "Latency").
        sys.setswitchinterval(self.config.switch_interval)
        # the cyclic collector runs on the main thread from here on, never on
        # the io thread (user/collector.py): before any kernel thread starts
        collector.start(self._wake_user_run)
        not_traced(Heartbeat(self.bound.sockets["hb"])).start()
        self.io.start()
        if not self.io.wait_ready():
            return 1
        # imported once the io run answers kernel_info (trio-asyncio, ~10 ms): the
        # asyncio loop of each user run, cells' default mode, its close grace
        from trikernel.user import aioloop

        aioloop.configure(autoawait=self.config.autoawait, shutdown_grace=self.config.shutdown_grace)
        try:
            self.user_run.run(self._set_up_user_side, self._user_side_ready)
        except BaseException as exc:
            error = _config_error(exc)
            if error is None:
                log.exception("the user run failed")
                self.exit_code = 1
                raise
            # IPython's config refused (a bad value, a missing profile): one
            # line, exit code 1, as ipykernel's "Bad config encountered"
            self._start_up_failed = True
            self.exit_code = fail(str(error), EXIT_RUNTIME)
        finally:
            self._finish()
        return self.exit_code

    def _wake_user_run(self) -> None:
        """The collector's wake-up (gc thread): the main user run, idle in
        its wait for I/O, runs the pending collection (user/collector.py)."""
        token = self.user_run.token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_nothing)

    def _set_up_user_side(self, nursery: trio.Nursery) -> Awaitable[None]:
        """UserRun's set-up: build the user side; the user nursery's host is
        started (awaited by UserRun) before the first job is taken."""
        self._interp = set_up(nursery, self._user_side)
        register_magic(self._interp.shell, self.subshells, self.core.subshell_ids)
        return nursery.start(self._interp.user_nursery.host)

    def _user_side_ready(self) -> None:
        assert self._interp is not None
        self.io.token.run_sync_soon(self.core.user_side_ready, self._interp)

    async def _debug(self, request: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
        """``debug_request`` → the DAP response (io run; the core calls it
        once the user side is up)."""
        assert self._interp is not None
        return await self.debugger.handle(request, parent, self._interp.shell)

    def _finish(self) -> None:
        if not self.user_run.stopping:
            # the user run ended without a shutdown request: shut down
            # cleanly rather than serve requests nobody can run
            if not self._start_up_failed:
                log.error("the user run ended unexpectedly; shutting the kernel down")
            self.exit_code = self.exit_code or 1
            self.request_shutdown()
        if not self.io.join(self.config.shutdown_grace + FLUSH_TIMEOUT + 2):
            # the io thread still owns its sockets: closing them under it
            # would be a crash; leave at once instead
            log.error("io thread did not finish; exiting")
            logging.shutdown()
            os._exit(self.exit_code or 1)
        if self.io.failed:
            self.exit_code = self.exit_code or 1
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
        if self.message_log is not None:  # the io run has ended: nothing records any more
            self.message_log.close()
        # sockets close with their configured LINGER (flush, bounded)
        self.bound.close()
        self.bound.context.term()
        self.bound.hb_context.term()


def _nothing() -> None:
    """A callback that only wakes the run it is sent to."""


def _config_error(exc: BaseException) -> ConfigError | None:
    """The ConfigError ``exc`` is, or is the only error of (trio groups what a
    nursery raised); None for anything else."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _config_error(exc.exceptions[0])
    return None


def ipython_version() -> str:
    """IPython's version for the ``kernel_info_reply`` banner, found without
    importing IPython (the io run answers kernel_info while the user run
    imports it): the ``ipython-X.Y.Z.dist-info`` folder beside the package
    (one listdir); else importlib.metadata's answer; "" if neither knows.
    Main thread, at start-up."""
    try:
        spec = importlib.util.find_spec("IPython")
        if spec is not None and spec.origin:
            site = os.path.dirname(os.path.dirname(spec.origin))
            found = [n for n in os.listdir(site) if n.lower().startswith("ipython-") and n.endswith(".dist-info")]
            if len(found) == 1:
                return found[0][len("ipython-") : -len(".dist-info")]
        from importlib.metadata import version

        return version("ipython")
    except Exception:
        log.debug("IPython's version not found", exc_info=True)
        return ""
