"""The one hand-off from the io run to a user run: :class:`Job`.

Runs on: created in the io run (it captures that run's token); run in a
user run (the main thread's, or a subshell's), which reports back by
setting :attr:`Job.done` through the io run's token. No run ever blocks on
the other (docs/design.md, "Threads and loops").
"""

from __future__ import annotations

import contextlib
import json
import logging
import traceback
from typing import TYPE_CHECKING, Any, Protocol

import trio

from trikernel.errors import JobFailed, KernelShuttingDown, TrikernelError
from trikernel.protocol.wire import dumps

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


log = logging.getLogger("trikernel.userrun")
_ERRORS = TrikernelError.__module__  # "trikernel.errors": the kernel's own error classes


class ThreadReply(Protocol):
    """What a Job calls when its body returned: the request's context
    (core/context.py ``RequestContext``), which sends the reply from this
    thread if it may."""

    def reply_from_thread(self, content: Any) -> bool:
        """Send the reply for ``content`` now, if the request allows it; whether it was sent."""


class Job:
    """One unit of work handed from the io run to a user run.

    Args:
        fn: an async callable with no arguments, run in the user run.
        context: the request's :class:`~trikernel.core.context.RequestContext`
            (any :class:`ThreadReply`) when the reply may leave from the user run as soon as ``fn``
            returns (:meth:`RequestContext.reply_from_thread`, a sequential
            request), else None.

    Afterwards :attr:`result` holds what ``fn`` returned, or :attr:`error`
    how it failed (:class:`~trikernel.errors.KernelShuttingDown` when the
    user run was cancelled at shutdown). :attr:`done` is a ``trio.Event``
    of the io run, set through that run's token once everything else is over.

    Nothing of the user's crosses to the io run (issue 26.2: no user code
    runs on the io thread, ``__del__`` included). An error is made plain in
    the user run: a KeyboardInterrupt or a kernel error (``TrikernelError``)
    loses its traceback, context and cause (their frames hold user objects);
    any other exception becomes :class:`~trikernel.errors.JobFailed`, with
    its type name, text and traceback as strings. A reply's content that the
    io run will send (the thread did not) is made plain JSON data here
    (:func:`_plain`), so its serialisation there calls no ``tolist`` or
    ``__int__`` of a user object.

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
        except trio.Cancelled:
            self.error = KernelShuttingDown("cancelled: the kernel is shutting down")
            raise
        except BaseException as exc:  # an interrupt, any failure: the io run reports it
            self.error = _detached(exc)  # exc and its frames are released here, in the user run
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

    def refuse(self, reason: str) -> None:
        """Finish the job without running it: its run ended first
        (:attr:`error` is :class:`~trikernel.errors.KernelShuttingDown`).
        Runs on: the user run that was to run it."""
        self.error = KernelShuttingDown(reason)
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
        sent = False
        try:
            sent = self.context.reply_from_thread(self.result)
        except Exception:  # a bug, or a socket closed at shutdown: the io run answers instead
            log.exception("the reply could not be sent from the user run; the io run sends it")
        if not sent and isinstance(self.result, dict):
            self.result = _plain(self.result)

    def _finish(self) -> None:
        # the io run already ended (shutdown): nobody waits for this job
        with contextlib.suppress(trio.RunFinishedError):
            self._io_token.run_sync_soon(self.done.set)


@trio.lowlevel.disable_ki_protection
async def _call_interruptible(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


def _type_name(obj: object) -> str:
    """``type(obj).__name__`` read from the type itself (a metaclass cannot take it over)."""
    return str(type.__dict__["__name__"].__get__(type(obj)))


def _detached(exc: BaseException) -> BaseException:
    """(user run) ``exc`` as the io run may hold it: nothing of the user's left (class docstring)."""
    if isinstance(exc, (KeyboardInterrupt, TrikernelError)) and type(exc).__module__ in ("builtins", _ERRORS):
        exc.__traceback__ = exc.__context__ = exc.__cause__ = None
        return exc
    try:
        evalue = str(exc)
    except BaseException as inner:  # the user's __str__ raised (or was interrupted)
        evalue = f"<str() of the error failed: {_type_name(inner)}>"
    try:
        detail = "".join(traceback.format_exception(exc)) if log.isEnabledFor(logging.DEBUG) else ""
    except BaseException:
        detail = ""
    return JobFailed(_type_name(exc), evalue, detail)


def _plain(content: dict[str, Any]) -> dict[str, Any]:
    """(user run) ``content`` as plain JSON data (``wire.dumps``' conversions happen
    here); if it cannot be encoded, an error content saying so."""
    try:
        return dict(json.loads(dumps(content)))
    except Exception as exc:
        log.warning("a reply's content is not JSON data (%s); an error reply is sent instead", _type_name(exc))
        plain: dict[str, Any] = {
            "status": "error",
            "ename": "TypeError",
            "evalue": f"the reply's content could not be encoded as JSON ({_type_name(exc)})",
            "traceback": [],
        }
        if isinstance(content.get("execution_count"), int):
            plain["execution_count"] = int(content["execution_count"])
        return plain
