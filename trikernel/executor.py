"""The main thread's persistent user trio run and the job hand-off.

docs/design.md, "Threads and loops". The main thread runs one ``trio.run`` for the kernel's
life. Its main task takes one *sequential* job at a time (execute,
complete, inspect, history, is_complete) and awaits it right there, so
top-level ``await`` in a cell runs in the main task and trio's own
KeyboardInterrupt delivery reaches it. *Concurrent* jobs (comm messages from
the frontend) start as tasks in the user nursery, so a widget's ``on_msg``
runs while an async cell awaits.

Hand-off io run → user run: ``TrioToken.run_sync_soon`` of the user run
(non-blocking, thread-safe). Completion user run → io run: the job's
``trio.Event`` set through the io run's token. No run ever blocks on the
other. The io side bounds jobs in flight (one sequential, a limiter for
concurrent ones), so the channel here never overflows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger("trikernel.executor")

#: Sequential jobs buffered in the user run (the io side keeps <= 1 in flight).
SEQ_BUFFER = 4


class Job:
    """A unit of work for the user run; completion is a trio.Event in the io run."""

    __slots__ = ("_io_token", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Awaitable[Any]]):
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = trio.Event()  # belongs to the io run
        self._io_token = trio.lowlevel.current_trio_token()

    async def run(self, *, interruptible: bool = False) -> None:
        try:
            if interruptible:
                self.result = await _call_interruptible(self.fn)
            else:
                self.result = await self.fn()
        except KeyboardInterrupt as exc:  # interrupt that missed user code
            self.error = exc
        except trio.Cancelled:
            self.error = RuntimeError("cancelled at shutdown")
            raise
        except BaseException as exc:
            # handed to the io run, which reports it (bad input: counted and
            # rate-limited, badinput.py); a traceback per job would let a peer
            # fill the log
            log.debug("job failed", exc_info=True)
            self.error = exc
        finally:
            self._io_token.run_sync_soon(self.done.set)


@trio.lowlevel.enable_ki_protection
async def _run_concurrent(job: Job) -> None:
    """A concurrent job (comm handler) as a task of the user nursery.

    Its glue is KI-protected (an interrupt never skips setting ``done``);
    the handler itself is not, so a handler that loops or sleeps can be
    interrupted like a cell.
    """
    await job.run(interruptible=True)


@trio.lowlevel.enable_ki_protection
def _setup_protected(setup: Callable[[trio.Nursery], None], nursery: trio.Nursery) -> None:
    """Run ``setup`` (IPython loading) with interrupts held back.

    kernel_info is answered while IPython loads, so a client may interrupt
    then (found by tests/test_fuzz.py: it ended the user run and the
    kernel). Trio holds the KeyboardInterrupt until the main task's next
    checkpoint, in the job loop, which ignores an interrupt while idle.
    """
    setup(nursery)


@trio.lowlevel.disable_ki_protection
async def _call_interruptible(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


class _Stop:
    pass


class Executor:
    """Owns the user trio run on the main thread."""

    def __init__(self) -> None:
        self.token: trio.lowlevel.TrioToken | None = None
        self.stopped = threading.Event()
        self.nursery: trio.Nursery | None = None
        self._send: trio.MemorySendChannel[Job | _Stop] | None = None
        self.busy = False
        self.stopping = False

    # -- io side --------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue a sequential job (thread-safe, non-blocking)."""
        assert self.token is not None and self._send is not None
        self.token.run_sync_soon(self._send.send_nowait, job)

    def submit_concurrent(self, job: Job) -> None:
        """Start a job as a task in the user nursery (thread-safe)."""
        assert self.token is not None

        def start() -> None:
            assert self.nursery is not None
            self.nursery.start_soon(_run_concurrent, job)

        self.token.run_sync_soon(start)

    def stop(self) -> None:
        """Ask the user run to cancel the user nursery and return (thread-safe)."""
        self.stopping = True
        if self.token is None or self._send is None:
            return
        try:
            self.token.run_sync_soon(self._send.send_nowait, _Stop())
        except trio.RunFinishedError:
            pass

    # -- main thread ----------------------------------------------------------
    def run(self, setup: Callable[[trio.Nursery], None], on_ready: Callable[[], None]) -> None:
        """Run the user trio run until stop(); blocks the main thread.

        ``setup(nursery)`` runs first (IPython is loaded there); then
        ``on_ready()`` tells the io side that jobs may be submitted.
        """
        try:
            trio.run(self._main, setup, on_ready)
        except KeyboardInterrupt:
            # jupyter_client interrupts before it shuts a kernel down; an
            # interrupt that lands while the user run winds down is harmless.
            if not self.stopping:
                raise

    async def _main(self, setup: Callable[[trio.Nursery], None], on_ready: Callable[[], None]) -> None:
        send, recv = trio.open_memory_channel[Job | _Stop](SEQ_BUFFER)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                _setup_protected(setup, nursery)
                self._send = send
                self.token = trio.lowlevel.current_trio_token()
                on_ready()
                await self._loop(recv)
                nursery.cancel_scope.cancel()
        finally:
            self.stopped.set()

    async def _loop(self, recv: trio.MemoryReceiveChannel[Job | _Stop]) -> None:
        while True:
            try:
                job = await recv.receive()
                if isinstance(job, _Stop):
                    return
                self.busy = True
                try:
                    await job.run()
                finally:
                    self.busy = False
            except KeyboardInterrupt:
                # an interrupt while idle (or between jobs) does nothing harmful
                log.info("interrupt while idle: ignored")
