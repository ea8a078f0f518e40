"""The io thread: one trio run that owns the shell, control, stdin and iopub sockets.

Runs on: the "trikernel-io" thread (docs/design.md, "Threads and loops"),
except :meth:`IORun.start`, :meth:`IORun.wait_ready` and
:meth:`IORun.request_shutdown`, which other threads call.

Its root nursery holds the iopub task (iopubtask.py), then the core (core/kernelcore.py), the control, shell
and stdin channel tasks (core/kernelcore.py, server/stdin.py) and the launcher
watcher. Each starts with ``task_status``, so "serving" is a fact when
:meth:`IORun.wait_ready` returns. Shutdown: the channel tasks are cancelled
after the user run stopped, then the IOPub queue is closed and the iopub
task flushes it (bounded by FLUSH_TIMEOUT).

SIGINT is blocked on this thread: a process-directed SIGINT must reach the
main thread, where user code runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from trikernel import PARENT_AT_START
from trikernel.threads import not_traced

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from trikernel.core.interfaces import SubshellRuns, UserRunHandle
    from trikernel.core.kernelcore import KernelCore
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.server.iopubqueue import IOPubQueue
    from trikernel.server.iopubtask import IOPubTask
    from trikernel.server.requests import RequestServer
    from trikernel.server.sockets import TrioSocket
    from trikernel.server.stdin import StdinBridge

log = logging.getLogger("trikernel.iorun")

#: Seconds the iopub task gets to flush pending messages at shutdown.
FLUSH_TIMEOUT = 5.0


class Service(Protocol):
    """An extra io-run task (e.g. the gateway comm port, commport.py).

    The io run starts it with ``await nursery.start(service)``, so it is
    called as ``service(task_status=...)`` on the io thread; it calls
    ``task_status.started()`` once it serves and runs until the io run
    cancels it at shutdown (trio's ``serve_listeners`` convention).
    """

    def __call__(self, *, task_status: trio.TaskStatus[None] = ...) -> Awaitable[None]: ...


@dataclass
class IORunParts:
    """The io run's tasks, built on the main thread before it starts."""

    builder: MessageBuilder
    queue: IOPubQueue
    iopub: IOPubTask
    core: KernelCore
    requests: RequestServer
    stdin: StdinBridge
    stdin_socket: TrioSocket
    user_run: UserRunHandle
    #: seconds user code gets to stop at shutdown (``--shutdown-grace``)
    shutdown_grace: float
    #: seconds between checks that the launching process lives
    parent_poll_interval: float
    #: extra io-run services (e.g. a gateway comm port), each started with task_status
    services: tuple[Service, ...] = ()
    #: the subshells (JEP 91), stopped beside the main user run at shutdown
    subshells: SubshellRuns | None = None


class IORun:
    """The io thread and its trio run."""

    def __init__(self, parts: IORunParts):
        self._p = parts
        self.failed = False  #: the run ended with an error (read after join)
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._shutdown: trio.Event | None = None
        self._thread = not_traced(threading.Thread(target=self._run_thread, name="trikernel-io", daemon=True))

    # -- other threads -----------------------------------------------------------
    def start(self) -> None:
        """Start the io thread (main thread)."""
        self._thread.start()

    def wait_ready(self) -> bool:
        """Block until every channel is served; False if the io run failed to start."""
        self._ready.wait()
        return self._token is not None and not self.failed

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        """The io run's token (valid once :meth:`wait_ready` returned True)."""
        assert self._token is not None
        return self._token

    def request_shutdown(self) -> None:
        """Begin an orderly shutdown (thread-safe; idempotent)."""
        if self._token is not None and self._shutdown is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._shutdown.set)

    def join(self, timeout: float) -> bool:
        """Wait for the io thread; True if it has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- io thread -----------------------------------------------------------------
    def _run_thread(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            trio.run(self._main)
        except BaseException:
            log.exception("io thread failed")
            self.failed = True
        finally:
            self._ready.set()
            self._p.user_run.stop()
        grace = self._p.shutdown_grace
        if not self._p.user_run.stopped.wait(grace):
            # user code does not return: nothing more to wait for
            log.warning("user code did not stop within %.1fs; exiting", grace)
            logging.shutdown()
            os._exit(1 if self.failed else 0)

    async def _main(self) -> None:
        p = self._p
        self._token = trio.lowlevel.current_trio_token()
        self._shutdown = trio.Event()
        async with trio.open_nursery() as outer:
            await outer.start(p.iopub.run)
            await p.queue.put(p.builder.status("starting", None))
            async with trio.open_nursery() as inner:
                await inner.start(p.core.run)
                await inner.start(p.requests.serve, "control")
                await inner.start(p.requests.serve, "shell")
                await inner.start(p.stdin.serve, p.stdin_socket)
                for service in p.services:
                    await inner.start(service)
                inner.start_soon(self._watch_parent)
                self._ready.set()
                await self._shutdown.wait()
                await self._stop_user_run()
                inner.cancel_scope.cancel()
            p.queue.close()
            outer.cancel_scope.deadline = trio.current_time() + FLUSH_TIMEOUT

    async def _stop_user_run(self) -> None:
        run = self._p.user_run
        run.stop()
        grace = self._p.shutdown_grace
        subshells = self._p.subshells
        async with trio.open_nursery() as nursery:
            if subshells is not None:  # at the same time as the main run, within the same grace
                subshells.stop_all()
                nursery.start_soon(subshells.wait_stopped, grace)
            stopped = await trio.to_thread.run_sync(run.stopped.wait, grace, abandon_on_cancel=True)
            if not stopped and run.busy:
                log.warning("user code still running at shutdown; interrupting it")
                run.interrupt()
                await trio.to_thread.run_sync(run.stopped.wait, 1.0, abandon_on_cancel=True)

    async def _watch_parent(self) -> None:
        """Shut down when the launching process dies (``JPY_PARENT_PID``).

        ipykernel's rule: watched only when it names this process's parent
        at start-up — the parent the process had as the package was first
        imported (``trikernel.PARENT_AT_START``), not when this task starts:
        loading the kernel takes seconds on a busy machine, and a launcher
        that died meanwhile left a kernel that never exited (seen in the
        loaded suite, ``test_exits_when_launcher_dies``). Wrappers and
        gateway bootstrap scripts set it to some other process; then it says
        nothing about our launcher, and it is ignored (a debug line says so).
        """
        raw = os.environ.get("JPY_PARENT_PID", "")
        try:
            ppid = int(raw)
        except ValueError:
            return
        if ppid <= 1:
            return
        if ppid != PARENT_AT_START:
            log.debug("JPY_PARENT_PID=%d is not this process's parent (%d); not watched", ppid, PARENT_AT_START)
            return
        assert self._shutdown is not None
        while True:
            if os.getppid() != ppid:  # also gone before this task started
                log.warning("launching process %d is gone; shutting down", ppid)
                self._shutdown.set()
                return
            await trio.sleep(self._p.parent_poll_interval)  # no event tells us the parent is gone
