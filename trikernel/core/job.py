"""The one hand-off from the io run to a user run: :class:`Job`.

Runs on: created in the io run (it captures that run's token); run in a
user run (the main thread's, or a subshell's), which reports back by
setting :attr:`Job.done` through the io run's token. No run ever blocks on
the other (docs/design.md, "Threads and loops").
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from trikernel.errors import KernelShuttingDown

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


log = logging.getLogger("trikernel.userrun")


class ThreadReply(Protocol):
    """What a Job calls when its body returned: the request's context
    (core/context.py ``RequestContext``), which sends the reply from this
    thread if it may."""

    def reply_from_thread(self, content: Any) -> None:
        """Send the reply for ``content`` now, if the request allows it."""


class Job:
    """One unit of work handed from the io run to a user run.

    Args:
        fn: an async callable with no arguments, run in the user run.
        context: the request's :class:`~trikernel.core.context.RequestContext`
            (any :class:`ThreadReply`) when the reply may leave from the user run as soon as ``fn``
            returns (:meth:`RequestContext.reply_from_thread`, a sequential
            request), else None.

    Afterwards :attr:`result` holds what ``fn`` returned, or :attr:`error`
    the exception it raised (KeyboardInterrupt included;
    :class:`~trikernel.errors.KernelShuttingDown` when the user run was
    cancelled at shutdown). :attr:`done` is a ``trio.Event`` of the io run,
    set through that run's token once everything else is over.

    Runs on: create in the io run; :meth:`run` only in a user run.
    """

    __slots__ = ("_io_token", "context", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Awaitable[Any]], context: ThreadReply | None = None):
        self.fn = fn
        self.context = context
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = trio.Event()  # belongs to the io run
        self._io_token = trio.lowlevel.current_trio_token()

    @trio.lowlevel.enable_ki_protection
    async def run(self, before_done: Callable[[], None] | None = None) -> None:
        """Run ``fn`` (user run). The glue is KI-protected, so an interrupt
        can never skip telling the io run; ``fn`` itself is not, so a cell or
        handler that loops or sleeps is interrupted like a cell.

        Args:
            before_done: runs after ``fn``, before the reply can leave (from
                here or from the io run, which is told last).

        Cancellation: a cancel (shutdown) records KernelShuttingDown in
        :attr:`error`, tells the io run, and re-raises ``trio.Cancelled``.
        """
        try:
            self.result = await _call_interruptible(self.fn)
        except KeyboardInterrupt as exc:  # an interrupt that reached the job itself
            self.error = exc
        except trio.Cancelled:
            self.error = KernelShuttingDown("cancelled: the kernel is shutting down")
            raise
        except BaseException as exc:  # any failure goes back to the io run, which reports it
            self.error = exc
        finally:
            try:
                if before_done is not None:
                    before_done()
                if self.context is not None and self.error is None:
                    self._send_reply()
            except KeyboardInterrupt:
                # an asynchronous interrupt (UserRun.interrupt's fallback when
                # user code disabled SIGINT) raised while the job ran, landing
                # after its code returned, before the job stopped being
                # interruptible: the request is over; the io run must still be
                # told (a reply the thread had not sent, it sends)
                log.info("interrupt after the job's code returned: ignored")
            finally:
                self._finish_surely()

    def _finish_surely(self) -> None:
        """:meth:`_finish`, also when an asynchronous interrupt lands in it (a
        concurrent job is interruptible up to here): the io run is always
        told (Event.set twice is harmless)."""
        while True:
            try:
                self._finish()
                return
            except KeyboardInterrupt:
                log.info("interrupt while telling the io run a job ended: ignored")

    def _send_reply(self) -> None:
        assert self.context is not None
        try:
            self.context.reply_from_thread(self.result)
        except Exception:  # a bug, or a socket closed at shutdown: the io run answers instead
            log.exception("the reply could not be sent from the user run; the io run sends it")

    def _finish(self) -> None:
        # the io run already ended (shutdown): nobody waits for this job
        with contextlib.suppress(trio.RunFinishedError):
            self._io_token.run_sync_soon(self.done.set)


@trio.lowlevel.disable_ki_protection
async def _call_interruptible(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()
