"""The user nursery: background trio tasks that outlive the cell that made them.

Available as ``trikernel.nursery`` and as ``nursery`` in the user namespace.
A task started with ``nursery.start_soon`` keeps running while later cells
run and while the kernel is idle. Its output goes to the cell that started
it (the parent header is a context variable, inherited at spawn). An
exception in it is written to that cell's stderr ("Exception in
trikernel.nursery task NAME:" and the traceback), as ipykernel writes an
asyncio task's unretrieved exception: not an ``error`` output, which would
say that the cell raised (papermill fails a notebook for any). It does not
cancel the loop or the kernel. Shutdown cancels these tasks
(``finally`` blocks run).

The tasks live in a nursery of their own, held open by :meth:`UserNursery.host`
(a task of the kernel's user run). ``nursery.cancel_scope.cancel()`` — the
trio way to stop everything a nursery runs — cancels those tasks; the host
then opens a fresh nursery, and the kernel's loop is untouched.

Runs on: the main thread's user run (``host``, ``start``);
``UserNursery.start_soon`` from any thread or run (handed over through
the main run's token).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from trikernel.user import aioloop
from trikernel.user.outstream import current_request

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

log = logging.getLogger("trikernel.usernursery")


class UserNursery:
    """A view of the kernel's user nursery that reports task errors."""

    def __init__(self, nursery: trio.Nursery, report: Callable[[str, BaseException, TracebackType | None], None]):
        """``nursery``: the user run's nursery (until :meth:`host` has
        started and opened the tasks' own); ``report(header, exc, tb)``: writes a task's
        failure to the current cell's stderr (``tracebacks.show_on_stderr``)."""
        self._nursery = nursery  # until host() runs: the user run's own nursery
        self._report_failure = report
        self._token = trio.lowlevel.current_trio_token()  # the main user run's

    async def host(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the user tasks' nursery open; reopen it after a user cancels it.

        Runs for the kernel's life in the user run, started with
        ``nursery.start`` before the first job (interpreter.set_up): ``started()``
        comes once the tasks' own nursery is open, so no cell's task lands
        in the run's nursery instead (seen when an execute_request came
        while IPython loaded: the first cell's task was not among
        ``child_tasks`` and a cancel of ``cancel_scope`` missed it). Kernel
        shutdown cancels it (and so every user task) from outside.
        """
        while True:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep_forever()
            # only a cancel of this nursery's own scope gets here
            log.info("user nursery cancelled by user code; a fresh one is open")

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """Cancel it to stop every background task (a fresh nursery follows)."""
        return self._nursery.cancel_scope

    @property
    def child_tasks(self) -> frozenset[trio.lowlevel.Task]:
        """The background tasks running now in the user tasks' nursery
        (``trio.Nursery.child_tasks``, a frozenset of ``trio.lowlevel.Task``); the hosting
        task itself is not among them. Read it in the main user run; the set is replaced when
        a fresh nursery opens."""
        return self._nursery.child_tasks

    def _report(self, exc: BaseException) -> None:
        """In the failed task (its context: the cell that started it)."""
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next  # hide our own wrapper's frame
        try:
            name = trio.lowlevel.current_task().name
            self._report_failure(f"Exception in trikernel.nursery task {name}:", exc, tb)
        except Exception:
            log.exception("could not show a background task's error")

    def _guard(
        self, fn: Callable[..., Awaitable[Any]], *, raise_before_started: bool = False
    ) -> Callable[..., Awaitable[Any]]:
        """Wrap a user task: errors are shown, never propagate into the loop.

        KeyboardInterrupt protection: trio raises a SIGINT straight into the
        running frame unless it is protected; protected, it is delivered to
        the main task, where the cell runs. So an interrupt reaches the cell,
        not whichever background task happened to be running.
        With ``raise_before_started`` (for ``start``) an error before
        ``task_status.started()`` goes to the awaiting caller, as in trio.
        """

        @trio.lowlevel.enable_ki_protection
        async def guarded(*args: Any, task_status: Any = trio.TASK_STATUS_IGNORED, **kwargs: Any) -> Any:
            status = _Status(task_status)
            try:
                # aioloop.run_task: the task may await asyncio too (the asyncio mode)
                if raise_before_started:
                    return await aioloop.run_task(fn(*args, task_status=status, **kwargs))
                return await aioloop.run_task(fn(*args, **kwargs))
            except trio.Cancelled:
                raise
            except BaseException as exc:  # any failure of a user task is shown, never kills the loop
                if raise_before_started and not status.done:
                    raise
                self._report(exc)
                return None

        guarded.__name__ = getattr(fn, "__name__", "task")
        guarded.__qualname__ = getattr(fn, "__qualname__", "task")
        return guarded

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any, name: object = None) -> None:
        """Start ``async_fn(*args)`` in the background (trio.Nursery.start_soon).

        From another trio run (a subshell's cell, subshells.py) or a thread,
        the task is handed to the main user run through its token and starts
        there soon after.
        """
        guarded = self._guard(async_fn)
        if self._in_own_run():
            self._nursery.start_soon(guarded, *args, name=name or async_fn)
            return
        request = current_request.get()  # its output still goes to the cell that started it

        def start() -> None:
            token = current_request.set(request)  # inherited by the new task
            try:
                self._nursery.start_soon(guarded, *args, name=name or async_fn)
            finally:
                current_request.reset(token)

        self._token.run_sync_soon(start)

    async def start(self, async_fn: Callable[..., Awaitable[Any]], *args: Any, name: object = None) -> Any:
        """Start and wait until it calls ``task_status.started()`` (trio.Nursery.start).

        An error before ``started()`` is raised here, in the awaiting cell;
        one after it is written to this cell's stderr, as for ``start_soon``.
        """
        if not self._in_own_run():
            raise RuntimeError("nursery.start() must be awaited in the main shell; use nursery.start_soon() here")
        return await self._nursery.start(self._guard(async_fn, raise_before_started=True), *args, name=name or async_fn)

    def _in_own_run(self) -> bool:
        try:
            return trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:  # no trio run in this thread
            return False

    def __repr__(self) -> str:
        return f"<trikernel user nursery: {len(self._nursery.child_tasks)} tasks>"


class _Status:
    """Records whether ``started()`` was called on the real task_status."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.done = False

    def started(self, value: Any = None) -> None:
        self.done = True
        self.inner.started(value)
