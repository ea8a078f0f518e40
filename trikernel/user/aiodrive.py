"""One coroutine awaiting trio and asyncio alike: the driver, the cell's stand-in task, mixed tasks.

Runs on: the thread of the user run that drives the coroutine (the main
thread, or a subshell's thread), inside that run's trio task; nothing here
is thread-safe.

trio and asyncio suspend a coroutine differently: trio's traps yield one of
trio's trap objects and are answered with an ``outcome`` sent back in;
asyncio's awaits yield a future (``await fut``) or ``None``
(``asyncio.sleep(0)``) and expect their task to wake them. :func:`drive`
steps a coroutine from a trio task and answers each yield the way the
flavour that yielded it expects (docs/design.md, "asyncio beside trio"):

- a **trio trap** goes to trio unchanged;
- an **asyncio future** is waited for with ``trio_asyncio.run_aio_future``
  (a trio cancel or a KeyboardInterrupt cancels the future and is raised
  at the coroutine's ``await``);
- a **bare yield** lets the asyncio loop run what it has queued
  (``loop.synchronize()``), else is a trio checkpoint.

While a step runs, asyncio's current task is a :class:`CellTask` that
stands for the trio task (``asyncio.timeout``, ``TaskGroup``, ``wait_for``
on 3.12+ and aiohttp's timers need one); its ``cancel()`` raises
``asyncio.CancelledError`` at the await the coroutine is blocked in, trio or
asyncio. ``trio_asyncio.allow_asyncio`` does the same job but gives trio a
bare yield (``TypeError: trio.run received unrecognized yield message
None``) and has no current task (tests/test_aiodrive.py keeps both cases).

**Mixed tasks** (:func:`task_factory`): ``loop.create_task`` makes an
asyncio Task (a :class:`Task`) whose coroutine is driven by a trio task
of its own, so an asyncio task may await trio too. trio-asyncio runs every
stock task's step inside its one loop task, where a trio call corrupts
trio's cancel-scope stack ("Cancel scope stack corrupted") as soon as two
such tasks interleave.

KeyboardInterrupt: :func:`drive` is KI-protected (an interrupt that lands
in its own bookkeeping waits for the next checkpoint); a cell's code runs
through an unprotected call (:func:`_send_interruptible`), so SIGINT is
raised in the cell's code as before; a task's code through a protected one,
so SIGINT goes to the main task (the cell), as for ``trikernel.nursery``.

Internals of asyncio and trio used (checked at import: :data:`UNSUPPORTED`):
``asyncio.tasks._enter_task``/``_leave_task``, ``asyncio.futures._get_loop``;
trio's trap classes (a fast path only) and ``Task._attempt_abort`` (without
it, ``CellTask.cancel()`` of a trio wait is delivered at the next await).
"""

from __future__ import annotations

import asyncio
import asyncio.base_tasks as _base_tasks
import contextvars
import logging
import types
from typing import TYPE_CHECKING, Any

import trio
import trio_asyncio

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Generator

log = logging.getLogger("trikernel.aiodrive")

try:  # asyncio's bookkeeping of the current task (asyncio.current_task())
    _enter_task: Any = asyncio.tasks._enter_task
    _leave_task: Any = asyncio.tasks._leave_task
    _future_loop: Any = getattr(asyncio.futures, "_get_loop")  # noqa: B009  (private: mypy does not know it)
    UNSUPPORTED: str | None = None
except AttributeError as exc:  # pragma: no cover - a Python whose asyncio differs
    UNSUPPORTED = f"this Python's asyncio has no {exc.name}"

try:  # trio's trap objects: a trap is passed on without the checks below
    from trio._core import _traps as _trio_traps

    _TRIO_TRAPS: frozenset[type] = frozenset(
        getattr(_trio_traps, n)
        for n in ("WaitTaskRescheduled", "CancelShieldedCheckpoint", "PermanentlyDetachCoroutineObject")
        if hasattr(_trio_traps, n)
    )
except ImportError:  # pragma: no cover - every yield then takes the general path
    _TRIO_TRAPS = frozenset()

#: trio's abort of a blocked task (what a cancel scope does); without it a
#: CellTask.cancel() of a trio wait waits for the coroutine's next await
_CAN_ABORT = hasattr(trio.lowlevel.Task, "_attempt_abort")

_AsyncioTask: Any = asyncio.Task  # the C Task at import (nest_asyncio rebinds the name later)
_AsyncioFuture: Any = asyncio.Future


class CellTask:
    """asyncio's current task while a trio task runs a coroutine under :func:`drive`.

    A cell's own (:func:`run_mixed`), or the driver of a :class:`Task`
    (then ``asyncio.current_task()`` is that Task, ``_as_task``). It has what
    asyncio code asks of the current task: ``cancel()`` / ``cancelling()`` /
    ``uncancel()`` with asyncio's meaning, ``get_loop()``, ``get_name()``.
    Use on the thread of its run only.
    """

    def __init__(self, loop: Any, name: str = "cell"):
        """``loop``: the asyncio loop whose current task this stands for; ``name``: what
        ``get_name()`` says."""
        self._loop = loop
        self._name = name
        self._fut_waiter: Any = None
        self._num_cancels_requested = 0
        self._must_cancel = False
        self._cancel_message: Any = None
        self._trio_task: trio.lowlevel.Task | None = None
        #: what asyncio.current_task() is while the coroutine runs
        self._as_task: Any = self

    def get_loop(self) -> Any:
        """The asyncio loop (``asyncio.Task.get_loop``)."""
        return self._loop

    def get_name(self) -> str:
        """The name given at creation (``asyncio.Task.get_name``)."""
        return self._name

    def set_name(self, value: object) -> None:
        """Rename (``asyncio.Task.set_name``)."""
        self._name = str(value)

    def get_coro(self) -> None:
        """None: the coroutine belongs to a trio task, not to an asyncio Task."""
        return None

    def done(self) -> bool:
        """False: a running cell is never done while it can ask."""
        return False

    def cancelled(self) -> bool:
        """False (see :meth:`done`)."""
        return False

    def cancelling(self) -> int:
        """Cancellation requests not yet taken back (``asyncio.Task.cancelling``, 3.11)."""
        return self._num_cancels_requested

    def uncancel(self) -> int:
        """Take one request back (``asyncio.Task.uncancel``); returns the count left."""
        if self._num_cancels_requested > 0:
            self._num_cancels_requested -= 1
        return self._num_cancels_requested

    def cancel(self, msg: Any = None) -> bool:
        """``asyncio.Task.cancel``: ``asyncio.CancelledError(msg)`` is raised at the await
        the coroutine is blocked in (an asyncio future: the future is cancelled; a trio
        wait: aborted as a cancel scope aborts it), or at its next await. Returns True."""
        self._num_cancels_requested += 1
        return self._cancel_wait(msg)

    def _cancel_wait(self, msg: Any = None) -> bool:
        self._cancel_message = msg
        fut = self._fut_waiter
        if fut is not None and fut.cancel(msg=msg):
            return True  # its CancelledError reaches the coroutine at this await
        self._must_cancel = True
        self._abort_trio_wait()
        return True

    def _raise_cancel(self) -> None:
        self._must_cancel = False  # called by trio only when the abort succeeded
        raise asyncio.CancelledError(self._cancel_message)

    def _abort_trio_wait(self) -> None:
        """The coroutine is blocked in a trio wait: abort it as trio aborts a
        wait for a cancel scope (``Task._attempt_abort``, private), with
        CancelledError as the exception; a wait that cannot be aborted now
        (``Abort.FAILED``) keeps ``_must_cancel`` for the next await."""
        task = self._trio_task
        if not self._must_cancel or self._fut_waiter is not None or task is None or not _CAN_ABORT:
            return
        if getattr(task, "_abort_func", None) is None:
            return  # runnable: delivered at its next await
        task._attempt_abort(self._raise_cancel)

    def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
        """Refused: a running cell is not a future (RuntimeError)."""
        raise RuntimeError("the running cell is not an asyncio Task: it has no done callbacks")

    def remove_done_callback(self, fn: Any) -> int:
        """Nothing to remove: returns 0."""
        return 0

    def __repr__(self) -> str:
        return f"<CellTask {self._name} (a trio task, asyncio's current task)>"


@trio.lowlevel.disable_ki_protection
def _send_interruptible(send: Callable[[Any], Any], arg: Any) -> Any:
    """One step of a cell: SIGINT is raised in its code (the nearest marked frame is this one)."""
    return send(arg)


@trio.lowlevel.enable_ki_protection
def _send_protected(send: Callable[[Any], Any], arg: Any) -> Any:
    """One step of a background task: SIGINT goes to the main task."""
    return send(arg)


def _without_our_cause(exc: BaseException) -> BaseException:
    """An interrupt or trio cancel of an asyncio wait, without the CancelledError
    of the future it cancelled (trio-asyncio chains it as the cause): that is the
    mechanism's, and a traceback that shows it costs the interrupt's reply twice
    the formatting."""
    if isinstance(exc, KeyboardInterrupt | trio.Cancelled) and isinstance(exc.__cause__, asyncio.CancelledError):
        exc.__cause__ = None
        exc.__suppress_context__ = True
    return exc


def _pending(loop: Any) -> bool:
    """Callbacks are queued in trio-asyncio's loop (its ``_q_recv``)."""
    try:
        return bool(loop._q_recv.statistics().current_buffer_used)
    except AttributeError:  # pragma: no cover - not a trio-asyncio loop
        return True


async def _sleep0(loop: Any) -> None:
    if _pending(loop):
        await loop.synchronize()  # asyncio would run what is ready first: tasks just created take a step
    else:
        await trio.lowlevel.checkpoint()


@trio.lowlevel.enable_ki_protection
@types.coroutine
def drive(coro: Coroutine[Any, Any, Any], cell: CellTask, *, interruptible: bool = False) -> Generator[Any, Any, Any]:
    """Step ``coro`` from the calling trio task; await it as ``await drive(...)``.

    Args:
        coro: a coroutine that may await trio and asyncio (module docstring).
        cell: asyncio's current task while ``coro`` runs (its ``_as_task``).
        interruptible: SIGINT is raised in ``coro``'s code (a cell); else it
            goes to the main task (a background task).

    Returns:
        What ``coro`` returns. Raises what it raises.
    """
    loop = cell._loop
    enter, leave, traps = _enter_task, _leave_task, _TRIO_TRAPS
    step = _send_interruptible if interruptible else _send_protected
    run_aio_future = trio_asyncio.run_aio_future
    cell._trio_task = trio.lowlevel.current_task()
    me = cell._as_task
    send: Callable[[Any], Any] = coro.send
    arg: Any = None
    if cell._must_cancel:  # cancelled before its first step: asyncio never starts the coroutine then
        cell._must_cancel = False
        send, arg = coro.throw, asyncio.CancelledError(cell._cancel_message)
    try:
        while True:
            enter(loop, me)
            try:
                yielded = step(send, arg)
            except StopIteration as stop:
                return stop.value
            finally:
                leave(loop, me)
            send = coro.send
            if type(yielded) in traps:  # a trio trap: trio answers, the trap unwraps it in its own frame
                if cell._must_cancel:
                    loop.call_soon(cell._abort_trio_wait)  # runs once this task is blocked
                try:
                    arg = yield yielded
                except BaseException as exc:  # trio throws only what it cannot take (a bad yield)
                    send, arg = coro.throw, exc
                continue
            if getattr(yielded, "_asyncio_future_blocking", None) is not None:  # an asyncio future
                yielded._asyncio_future_blocking = False
                if _future_loop(yielded) is not loop:
                    send, arg = (
                        coro.throw,
                        RuntimeError(
                            f"the coroutine awaited {yielded!r}, attached to another event loop than this run's "
                            "(each shell and subshell has its own: asyncio.run_coroutine_threadsafe crosses them)"
                        ),
                    )
                    continue
                if cell._must_cancel and yielded.cancel(msg=cell._cancel_message):
                    cell._must_cancel = False
                cell._fut_waiter = yielded
                try:
                    arg = yield from run_aio_future(yielded).__await__()
                except BaseException as exc:  # the future's exception, or trio's Cancelled / KeyboardInterrupt
                    send, arg = coro.throw, _without_our_cause(exc)
                finally:
                    cell._fut_waiter = None
                continue
            if yielded is None:  # asyncio's bare yield (asyncio.sleep(0)): the loop runs what it has queued
                if not cell._must_cancel:
                    try:
                        yield from _sleep0(loop).__await__()
                        arg = None
                    except BaseException as exc:
                        send, arg = coro.throw, exc
                        continue
                if cell._must_cancel:  # cancel() before or during the sleep(0)
                    cell._must_cancel = False
                    send, arg = coro.throw, asyncio.CancelledError(cell._cancel_message)
                continue
            if cell._must_cancel:  # anything else is trio's to judge (it throws TypeError back)
                loop.call_soon(cell._abort_trio_wait)
            try:
                arg = yield yielded
            except BaseException as exc:
                send, arg = coro.throw, exc
    except GeneratorExit:
        coro.close()
        raise
    except BaseException:
        # the coroutine's frames in the exception's traceback keep their callers'
        # frames (f_back, 3.12+), this one included: it must not hold the Task,
        # or a failed, unreferenced Task is reported only by the cyclic collector
        me = cell = None  # type: ignore[assignment]
        raise


#: the trio task whose coroutine :func:`drive` steps now, in that task's
#: context: a nested cell (``%%capture``'s body) is awaited directly; a task
#: spawned from a driven one inherits the value but is another task
_driving: contextvars.ContextVar[trio.lowlevel.Task | None] = contextvars.ContextVar(
    "trikernel_aio_driving", default=None
)


def driving_task() -> trio.lowlevel.Task | None:
    """The trio task :func:`run_mixed` drives in this context: the calling task
    if it is driven (a task spawned from a driven one inherits another's)."""
    return _driving.get()


async def run_mixed(coro: Coroutine[Any, Any, Any], loop: Any, *, interruptible: bool, name: str = "cell") -> Any:
    """``await coro`` in the calling trio task with trio traps and asyncio futures both allowed.

    Args:
        coro: the coroutine (a cell, a background task).
        loop: the run's trio-asyncio loop; closed or None: ``coro`` is awaited as it is.
        interruptible: see :func:`drive`.
        name: the CellTask's name.

    Returns:
        What ``coro`` returns; raises what it raises. Already driven (a
        nested cell): awaited directly.
    """
    task = trio.lowlevel.current_task()
    if loop is None or loop.is_closed() or _driving.get() is task:
        return await coro
    token = _driving.set(task)
    try:
        return await drive(coro, CellTask(loop, name), interruptible=interruptible)
    finally:
        _driving.reset(token)


# -- mixed tasks -----------------------------------------------------------------------


class MixedTaskFuture(_AsyncioFuture):  # type: ignore[misc]
    """What a :class:`Task` awaits: resolved by the trio task that drives its coroutine.

    ``Task.cancel()`` cancels the future a task waits on; this one forwards
    it to the driver (:meth:`CellTask.cancel`), so the coroutine gets
    CancelledError at its current await, trio or asyncio, and the Task ends
    as the coroutine does (it may catch it and return). User run's thread.
    """

    _driver: CellTask | None = None

    def cancel(self, msg: Any = None) -> bool:
        """Forward a Task's cancel to the coroutine's driver; returns True if it was pending."""
        if self.done():
            return False
        driver = self._driver
        if driver is None:
            return bool(super().cancel(msg=msg))
        return driver._cancel_wait(msg)

    def _cancel_now(self, msg: Any = None) -> None:
        # super(), not asyncio.Future.cancel(self): nest_asyncio.apply() rebinds
        # asyncio.Future to the pure-Python class, whose cancel() on this C
        # future left it pending and its Task waiting for good
        super().cancel(msg=msg)


class Task(_AsyncioTask):  # type: ignore[misc]
    """A mixed task: an asyncio Task whose coroutine a trio task drives (:func:`task_factory`).

    Named ``Task``, as asyncio's, since its name is in what asyncio says of it
    ("Task exception was never retrieved", its repr).

    It is a real ``asyncio.Task``: awaitable, cancellable, in
    ``asyncio.all_tasks()``, with done callbacks; its own coroutine only
    awaits the :class:`MixedTaskFuture` the driver resolves. ``get_coro()``
    and ``repr()`` show the user's coroutine. User run's thread.
    """

    _driver: CellTask | None = None
    _user_coro: Any = None

    def cancel(self, msg: Any = None) -> bool:
        """``asyncio.Task.cancel``; before the Task's first step (it does not
        wait on its future yet) the driver is told too."""
        driver = self._driver
        if driver is not None and not self.done() and self._fut_waiter is None:
            driver._cancel_wait(msg)
        return bool(super().cancel(msg))

    def get_coro(self) -> Any:
        """The user's coroutine (``asyncio.Task.get_coro``)."""
        return self._user_coro

    def set_name(self, value: object) -> None:
        """``asyncio.Task.set_name``; None keeps the name (3.13.0's ``loop.create_task``
        calls ``set_name(name)`` on a factory's task even when no name was given)."""
        if value is not None:
            super().set_name(value)

    def __repr__(self) -> str:
        try:
            info = _base_tasks._task_repr_info(self)
            coro = getattr(asyncio.coroutines, "_format_coroutine")(self._user_coro)  # noqa: B009
            info = [f"coro=<{coro}>" if i.startswith("coro=") else i for i in info]
            return "<Task {}>".format(" ".join(info))
        except Exception:  # pragma: no cover - asyncio's private helpers changed
            return str(super().__repr__())


async def _shell(fut: MixedTaskFuture) -> Any:
    try:
        return await fut
    finally:
        del fut  # the frame stays in the exception's traceback: no cycle through the future


def task_factory(drivers: trio.Nursery, on_task: Callable[[Any], None] | None = None) -> Any:
    """A task factory (``loop.set_task_factory``) making :class:`Task`\\ s.

    Args:
        drivers: the nursery the driving trio tasks run in (closed with the loop).
        on_task: called with every task made, in the creating context.

    Returns:
        ``factory(loop, coro, **kwargs)``; call it on the loop's thread.
    """

    def factory(loop: Any, coro: Any, **kwargs: Any) -> Any:
        if not asyncio.iscoroutine(coro):  # asyncio's TypeError, from the stock Task
            return _AsyncioTask(coro, loop=loop, **kwargs)
        fut = MixedTaskFuture(loop=loop)
        task = Task(_shell(fut), loop=loop, **kwargs)
        task._user_coro = coro
        driver = CellTask(loop, task.get_name())
        driver._as_task = task
        fut._driver = task._driver = driver
        context = kwargs.get("context")
        if context is None:
            drivers.start_soon(_run_task, coro, driver, fut, name=task.get_name())
        else:
            context.run(drivers.start_soon, _run_task, coro, driver, fut, name=task.get_name())
        if on_task is not None:
            on_task(task)
        return task

    return factory


@trio.lowlevel.enable_ki_protection
async def _run_task(coro: Any, driver: CellTask, fut: MixedTaskFuture) -> None:
    """The trio task of a mixed task: drive its coroutine, resolve its future."""
    # trio-asyncio's running loop is read from the trio task's context, a
    # copy of the creator's: another run's after run_coroutine_threadsafe
    trio_asyncio.current_loop.set(driver._loop)
    _driving.set(trio.lowlevel.current_task())
    try:
        result = await drive(coro, driver)
    except asyncio.CancelledError as exc:
        if not fut.done():
            fut._cancel_now(exc.args[0] if exc.args else None)
    except trio.Cancelled:  # the loop closes: the Task ends cancelled, the trio task as trio wants
        if not fut.done():
            fut._cancel_now()
        raise
    except (KeyboardInterrupt, SystemExit) as exc:
        # raised into the Task's step, asyncio re-raises these out of the
        # loop, which would end the kernel's loop: the Task holds an error
        if not fut.done():
            err = RuntimeError(f"asyncio task {driver.get_name()!r} raised {type(exc).__name__}")
            err.__cause__ = _without_own_frames(exc)
            fut.set_exception(err)
    except BaseException as exc:
        if not fut.done():
            fut.set_exception(_without_own_frames(exc))
    else:
        if not fut.done():
            fut.set_result(result)
    finally:
        # no reference back to the Task from what its exception reaches, so
        # an unreferenced failed Task is collected (and its error reported) at once
        fut._driver = None
        driver._as_task = None


_OWN_CODES = frozenset(
    f.__code__ for f in (_run_task, drive, _send_protected, _send_interruptible) if hasattr(f, "__code__")
)


def _without_own_frames(exc: BaseException) -> BaseException:
    """``exc`` with the driver's frames dropped from the head of its traceback
    (they hold the Task: a reference cycle would delay its report to the collector)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code in _OWN_CODES:
        tb = tb.tb_next
    return exc.with_traceback(tb)
