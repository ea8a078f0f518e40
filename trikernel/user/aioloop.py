"""asyncio beside trio: the kernel's asyncio loop in each user run, and the cells and tasks that use it.

Runs on: the thread of a user run (the main thread, a subshell's thread):
:func:`kernel_loop` is entered in that run's main task; :func:`run_cell`,
:func:`run_task` in its tasks; :func:`configure`, :func:`set_mode` on the
main thread (start-up, ``%autoawait``).

One trio-asyncio loop per user run (docs/design.md, "asyncio beside trio"),
opened in the run's main task before the user side is set up and open for
the run's life, so cells, ``trikernel.nursery`` tasks and comm handlers all
see it (``trio_asyncio.current_loop`` is a context variable they inherit);
each subshell's run has its own. In the default mode (``%autoawait
asyncio``, or ``on``) a cell that awaits runs through aiodrive.py's driver,
so one coroutine awaits asyncio and trio alike; a sync cell runs with no
running loop, as plain Python (aiosync.py). ``%autoawait trio``: cells and
background tasks are pure trio, the driver is off their path.

The loop is trio-asyncio's, with a kernel's overrides (:func:`_harden`):

- ``run_until_complete`` / ``run_forever`` / ``stop`` raise
  :class:`~trikernel.errors.KernelLoopError` ("use ``await``"), and
  ``nest_asyncio.apply()`` leaves the loop alone (it cannot run a loop
  re-entrantly inside trio; the kernel stays alive);
- ``run_in_executor`` / ``set_default_executor`` take any
  ``concurrent.futures.Executor`` (trio-asyncio asserts its own);
- ``call_soon`` / ``call_later`` / ``call_at`` from another thread (what
  ``fut.set_result`` in a thread or a comm callback on a subshell's thread
  does) hop to the loop's thread, as ``call_soon_threadsafe`` does: asyncio
  leaves such calls undefined, and on this loop they reached trio's run from
  a foreign thread and ended the user run with ``TrioInternalError``;
- the exception handler writes an error to stderr in the cell that created
  the task, as ipykernel does (:func:`_handler`; trio-asyncio's re-raises
  into the loop's nursery and so ends the loop), at the time asyncio
  reports it: "Task exception was never retrieved" when the failed Task is
  collected, at once for a task nobody holds;
- its driver (``_main_loop``) is KI-protected: a SIGINT that lands in an
  asyncio callback goes to the cell instead of killing the loop;
- callbacks run in batches, as asyncio's ``_run_once`` runs its ready queue
  (:func:`_batched_main_loop_one`; trio-asyncio runs one per trio
  scheduling round);
- tasks are aiodrive's mixed tasks, each recording the request that made it
  (its output and errors go to that cell).

Closing (after the run's last job, before its nursery is cancelled): every
asyncio task is cancelled and waited for, within half ``--shutdown-grace``
(their ``finally`` blocks run, awaits included); then the trio tasks driving
what is left are cancelled; a stock Task that still ignores its cancel is
abandoned (logged), so it cannot hold the kernel's exit.

:data:`UNSUPPORTED` says why asyncio cells are off (trio-asyncio missing, or
without the internals used here and in aiodrive.py / aiosync.py): cells are
then pure trio and ``%autoawait asyncio`` answers with the reason.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import heapq
import linecache
import logging
import math
import sys
import threading
from typing import TYPE_CHECKING, Any

import sniffio
import trio

from trikernel.errors import KernelLoopError
from trikernel.user.outstream import current_request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Coroutine

log = logging.getLogger("trikernel.aioloop")

try:
    import trio_asyncio
    from trio_asyncio import _base as _ta_base
    from trio_asyncio import _handles as _ta_handles

    from trikernel.user import aiodrive, aiosync

    UNSUPPORTED: str | None = aiodrive.UNSUPPORTED or aiosync.UNSUPPORTED
except ImportError as exc:
    UNSUPPORTED = f"trio-asyncio is not installed ({exc}): cells run on trio only"

#: ``%autoawait`` modes: cells that await asyncio and trio alike, or pure trio
MODES = ("asyncio", "trio")


class _Settings:
    """Process-wide: one shell serves every lane (main thread writes, any user run reads)."""

    mode = "asyncio"
    #: seconds asyncio tasks get to end once cancelled when a run closes its loop
    close_grace = 1.5


def configure(*, autoawait: str, shutdown_grace: float) -> None:
    """Start-up (main thread, before the user run): the default ``%autoawait``
    mode (``KernelConfig.autoawait``) and the loops' close grace (half
    ``shutdown_grace``: the other half is the trio tasks' and the io run's).

    Raises:
        ValueError: ``autoawait`` is not one of :data:`MODES`.
    """
    if autoawait not in MODES:
        raise ValueError(f"autoawait must be one of {MODES}, got {autoawait!r}")
    _Settings.mode = autoawait
    _Settings.close_grace = shutdown_grace / 2


def set_mode(name: str) -> None:
    """Switch cells to ``"asyncio"`` (asyncio and trio) or ``"trio"`` (pure
    trio); the next cell runs so (main thread, ``%autoawait``).

    Raises:
        KernelLoopError: ``"asyncio"`` while asyncio cells are unsupported
            (the message says why).
    """
    if name == "asyncio" and UNSUPPORTED is not None:
        raise KernelLoopError(UNSUPPORTED)
    _Settings.mode = name


def mode() -> str:
    """The mode cells run in now: ``"asyncio"`` or ``"trio"`` (any thread)."""
    return "trio" if UNSUPPORTED is not None else _Settings.mode


def _asyncio_cells() -> bool:
    return _Settings.mode == "asyncio" and UNSUPPORTED is None


# -- cells and tasks ---------------------------------------------------------------------

_ASYNC_NODES = (ast.Await, ast.AsyncFor, ast.AsyncWith)


def cell_awaits(nodes: list[ast.stmt]) -> bool:
    """The cell (its statements, after IPython's AST transformers) awaits at
    top level: an ``await``, ``async for``/``with`` or async comprehension
    outside any function body. Errs on the side of True (a decorator's or a
    default's ``await`` counts, as Python evaluates them at top level):
    such a cell just runs under the driver. Any thread."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, _ASYNC_NODES):
            return True
        if isinstance(node, ast.comprehension) and node.is_async:
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(node.decorator_list)
            stack.append(node.args)
            if node.returns is not None:
                stack.append(node.returns)
            continue
        if isinstance(node, ast.Lambda):
            stack.append(node.args)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _may_await(cell_name: str, nodes: list[ast.stmt]) -> bool:
    """:func:`cell_awaits`, after a cheap look at the cell's text: IPython's
    compiler keeps it in ``linecache`` under ``cell_name``, and a cell whose
    text has neither ``await`` nor ``async`` cannot await (the AST rewrite of
    ``%time await`` keeps the word). Most cells take this path: the walk
    costs about 1 µs for ``pass`` and grows with the cell."""
    entry = linecache.cache.get(cell_name)
    if entry is not None and len(entry) > 2:
        text = "".join(entry[2])
        if "await" not in text and "async" not in text:
            return False
    return cell_awaits(nodes)


def driver_for(nodes: list[ast.stmt], cell_name: str, *, autoawait: bool) -> Any:
    """The loop to drive a cell on, or None to run it as it is.

    A cell that awaits (:func:`cell_awaits`), in the asyncio mode, with the
    run's loop open: that loop (:func:`run_cell` then steps it, every
    statement inside the kernel's running loop). Otherwise None: a sync cell
    (aiosync.py: no running loop), a cell nested in a driven one
    (``%%capture``'s body runs as the cell around it), or pure trio. Called
    in the user run's task that runs the cell (shell.TrikernelShell.run_ast_nodes),
    before the cell's first statement; a function, not a coroutine, so a sync
    cell pays no extra frame.
    """
    if UNSUPPORTED is not None or not autoawait or _Settings.mode != "asyncio":
        return None
    loop = trio_asyncio.current_loop.get()
    if loop is None or aiodrive.driving_task() is trio.lowlevel.current_task():
        return None
    return loop if _may_await(cell_name, nodes) else None


async def run_cell(cell: Coroutine[Any, Any, Any], loop: Any) -> Any:
    """Await ``cell`` (IPython's ``run_ast_nodes``) under the driver on ``loop``
    (:func:`driver_for`'s answer); in the task that runs the cell.

    Returns:
        What ``cell`` returns (True if an exception occurred, IPython's meaning).
    """
    return await aiodrive.run_mixed(cell, loop, interruptible=True)


async def run_task(coro: Awaitable[Any]) -> Any:
    """Await a background trio task's coroutine (``trikernel.nursery``) so it may await
    asyncio too, in the asyncio mode; an interrupt goes to the cell, not to it. Called
    in that task."""
    if UNSUPPORTED is not None or not _asyncio_cells():
        return await coro
    if not asyncio.iscoroutine(coro):
        return await coro
    return await aiodrive.run_mixed(coro, trio_asyncio.current_loop.get(), interruptible=False, name="task")


# -- the loop -----------------------------------------------------------------------------


def kernel_loop() -> contextlib.AbstractAsyncContextManager[Any]:
    """The user run's asyncio loop: ``async with kernel_loop():`` in the run's
    main task around set-up and the jobs; without trio-asyncio, nothing
    (pure trio, logged)."""
    if UNSUPPORTED is not None:
        log.info("%s", UNSUPPORTED)
        return contextlib.nullcontext()
    aiosync.install()
    return open_kernel_loop(_Settings.close_grace)


_REFUSE = (
    "the kernel's asyncio loop is already running: it runs for the kernel's life, beside trio, and "
    "cannot be run again inside itself. Await instead: `await {what}` in a cell"
)


@contextlib.asynccontextmanager
async def open_kernel_loop(close_grace: float) -> AsyncIterator[Any]:
    """A hardened trio-asyncio loop (module docstring), open in the calling trio task.

    Args:
        close_grace: seconds the loop's tasks get to end once cancelled at close.

    Yields:
        The loop. Every task spawned from the calling task inside the block sees it;
        the calling task's own code runs as a sync cell unless the driver steps it.
    """
    _protect_loop_driver()
    aiosync.set_cells_task(trio.lowlevel.current_task())
    try:
        async with _open_loop(close_grace) as loop:
            yield loop
    finally:
        aiosync.set_cells_task(None)


@contextlib.asynccontextmanager
async def _open_loop(close_grace: float) -> AsyncIterator[Any]:
    async with trio_asyncio.open_loop() as loop:
        _harden(loop)
        async with trio.open_nursery() as drivers:
            loop.set_task_factory(aiodrive.task_factory(drivers, _on_task))
            try:
                yield loop
            finally:
                loop.__dict__.pop("stop", None)  # trio-asyncio's close stops the loop itself
                await _cancel_tasks(loop, close_grace)
                drivers.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await loop.synchronize()  # mixed tasks whose drivers just ended take their last step
        _abandon_stuck_tasks(loop)


async def _cancel_tasks(loop: Any, grace: float) -> None:
    """asyncio's shutdown of a loop's tasks (``asyncio.run``'s): cancel each,
    wait for them, bounded by ``grace``; shielded (the run may be ending)."""
    with trio.move_on_after(grace) as scope:
        scope.shield = True
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        for t in pending:
            if not t.done():
                done = trio.Event()  # abortable, unlike run_aio_future: a task that ignores its cancel
                t.add_done_callback(functools.partial(_set, done))
                await done.wait()
    if scope.cancelled_caught:
        log.warning("asyncio tasks still running %.1fs after they were cancelled at shutdown", grace)


def _set(event: trio.Event, _future: object) -> None:
    event.set()


def _abandon_stuck_tasks(loop: Any) -> None:
    """trio-asyncio's close waits, shielded, for every task the loop lists: a
    stock Task that swallows its cancel would hold the kernel's exit for
    good. Such a task is abandoned instead, as ``asyncio.run`` abandons
    tasks started while it shuts down."""
    unregister = getattr(asyncio.tasks, "_unregister_task", None)
    for t in asyncio.all_tasks(loop):
        if not t.done() and unregister is not None:
            log.warning("asyncio task %r did not end when cancelled: abandoned", t)
            unregister(t)


_driver_protected = False


def _protect_loop_driver() -> None:
    """Mark trio-asyncio's loop driver KI-protected (once): a SIGINT that lands
    in an asyncio callback (a stock task's step) is delivered to the main
    task (the cell) instead of killing the callback and then the loop."""
    global _driver_protected
    if _driver_protected:
        return
    _driver_protected = True
    base = _ta_base.BaseTrioEventLoop
    base._main_loop = trio.lowlevel.enable_ki_protection(base._main_loop)
    base._main_loop_one = trio.lowlevel.enable_ki_protection(base._main_loop_one)


def _harden(loop: Any) -> None:
    """The kernel's overrides, on the loop instance (module docstring)."""

    def run_until_complete(future: Any) -> Any:
        if asyncio.iscoroutine(future):
            future.close()  # no "never awaited" warning on top of the error
        raise KernelLoopError(_REFUSE.format(what="f()") + " instead of loop.run_until_complete(f())")

    def run_forever() -> None:
        raise KernelLoopError(_REFUSE.format(what="asyncio.Event().wait()") + " instead of loop.run_forever()")

    def stop() -> None:
        raise KernelLoopError("the kernel's asyncio loop runs for the kernel's life: it cannot be stopped")

    original_run_in_executor = loop.run_in_executor
    executors: dict[str, Any] = {}

    def run_in_executor(executor: Any, func: Any, *args: Any) -> Any:
        if executor is None:
            executor = executors.get("default")
        if executor is None or isinstance(executor, trio_asyncio.TrioExecutor):
            return original_run_in_executor(executor, func, *args)
        loop._check_closed()
        return asyncio.wrap_future(executor.submit(func, *args), loop=loop)

    def set_default_executor(executor: Any) -> None:
        executors["default"] = executor

    queue_handle = loop._queue_handle
    loop_thread = threading.get_ident()
    token = trio.lowlevel.current_trio_token()

    def _queue_handle(handle: Any) -> Any:
        if threading.get_ident() == loop_thread:
            return queue_handle(handle)
        token.run_sync_soon(queue_handle, handle)
        return handle

    # each override shadows, on the instance, the loop method of its own name
    for override in (_queue_handle, run_until_complete, run_forever, stop, run_in_executor, set_default_executor):
        setattr(loop, override.__name__, override)
    loop._nest_patched = True  # nest_asyncio.apply() leaves this loop alone (its _patch_loop checks it)
    loop.set_exception_handler(_handler)
    if isinstance(getattr(loop, "_nursery", None), trio.Nursery):
        loop._nursery = _ProtectedNursery(loop._nursery)
    batched = _batched_main_loop_one(loop)
    if batched is not None:
        loop._main_loop_one = batched


class _ProtectedNursery:
    """The loop's nursery (``loop._nursery``), whose tasks start KI-protected.

    trio-asyncio runs some asyncio code in trio tasks of their own: reader and
    writer callbacks (``_io_task``: a transport's ``data_received``, aiohttp's
    parser), ``trio_as_future`` functions, child watchers. A SIGINT that
    landed there killed the task and then the loop and the user run (seen:
    interrupting an aiohttp request, 1 in 12). Protected, it goes to the
    main task, the cell. Loop's thread.
    """

    def __init__(self, nursery: trio.Nursery):
        self._nursery = nursery

    def start_soon(self, async_fn: Any, *args: Any, name: object = None) -> None:
        """``trio.Nursery.start_soon``, the task KI-protected."""
        self._nursery.start_soon(_protected, async_fn, *args, name=name or async_fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nursery, name)


@trio.lowlevel.enable_ki_protection
async def _protected(async_fn: Any, *args: Any) -> Any:
    return await async_fn(*args)


def _batched_main_loop_one(loop: Any) -> Any:
    """trio-asyncio's ``_main_loop_one`` runs ONE callback per trio
    scheduling round (a receive, a checkpoint, a cancel scope each). This
    one waits as that one does, then runs the timers due and every callback
    queued when it woke in one step, as asyncio's ``_run_once`` runs the
    ready queue it found. None when the loop lacks the internals it uses."""
    try:
        original = loop._main_loop_one
        queue, timers = loop._q_recv, loop._timers
        async_handle, exit_loop = _ta_handles.AsyncHandle, _ta_base.TrioAsyncioExit
        _ = (loop._nursery, async_handle._run, async_handle.__slots__)
    except AttributeError as exc:
        log.info("trio-asyncio's loop has no %s: its callbacks run one at a time", exc.name)
        return None
    heappop, heappush = heapq.heappop, heapq.heappush
    local = sniffio.thread_local

    def call(h: Any) -> None:
        if h._cancelled:
            return
        previous, local.name = local.name, "asyncio"
        try:
            h._run()
        except exit_loop:
            raise
        except (KeyboardInterrupt, SystemExit) as exc:  # user code in a stock task: not out of the loop
            loop.call_exception_handler(
                {"message": f"an asyncio callback raised {type(exc).__name__}", "exception": exc, "handle": h}
            )
        finally:
            local.name = previous
            # a Task's step ran in here: its exception's traceback keeps this frame
            # (f_back of the coroutine's, 3.12+), which must not keep the handle,
            # whose callback is the Task: the report of a failed Task nobody holds
            # would wait for the cyclic collector
            h = None

    async def take(obj: Any) -> None:
        if isinstance(obj, asyncio.TimerHandle):
            heappush(timers, obj)
        elif isinstance(obj, async_handle):  # a trio task of the loop's (trio_as_future, readers)
            obj._context.run(loop._nursery.start_soon, obj._run, name=obj._callback)
            await obj._started.wait()
        else:
            call(obj)
        obj = None  # as in call()

    async def one(no_wait: bool = False) -> None:
        if no_wait:  # the close path: trio-asyncio's own
            return await original(no_wait=True)  # type: ignore[no-any-return]
        if not (timers and timers[0]._when <= loop.time()) and not queue.statistics().current_buffer_used:
            timeout = timers[0]._when - loop.time() if timers else math.inf
            obj = None
            with trio.move_on_after(timeout):
                obj = await queue.receive()
            if obj is not None:
                await take(obj)
                obj = None  # as in call()
        now = loop.time()
        while timers and timers[0]._when <= now:
            call(heappop(timers))
        for _ in range(queue.statistics().current_buffer_used):  # what is queued now, not what these queue
            try:
                obj = queue.receive_nowait()
            except trio.WouldBlock:
                break
            await take(obj)
            obj = None  # as in call()
        await trio.lowlevel.checkpoint()

    return trio.lowlevel.enable_ki_protection(one)


# -- errors shown in their cell ---------------------------------------------------------------


def _on_task(task: Any) -> None:
    """Every task the loop makes: the request it was made in (its output goes there by
    context; its unretrieved error by this attribute, since asyncio reports it from the
    collector, in any context)."""
    task._trikernel_request = current_request.get()


def _request_of(context: dict[str, Any]) -> Any:
    """The request the handler's ``context`` belongs to: the one its task was
    made in, or the one its callback was scheduled in; else None (asyncio
    calls the handler from the collector too, in whatever runs then, so the
    current request would be a guess)."""
    for key in ("task", "future"):
        request = getattr(context.get(key), "_trikernel_request", None)
        if request is not None:
            return request
    handle_context = getattr(context.get("handle"), "_context", None)
    if handle_context is not None:
        return handle_context.get(current_request)
    return None


def _header(context: dict[str, Any]) -> str:
    """asyncio's first lines for the error: the message, then what it is about."""
    lines = [str(context.get("message") or "Unhandled exception in event loop")]
    for key in ("task", "future", "handle"):
        if key in context:
            lines.append(f"{key}: {_safe_repr(context[key])}")
    return "\n".join(lines)


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object: repr() failed>"


def _show_in_cell(context: dict[str, Any]) -> bool:
    """Show the handler's ``context`` as stderr text of the cell it belongs to (the
    creating cell: asyncio's message, then the traceback, as ipykernel shows it), never
    as an ``error`` output, which says that cell raised (tracebacks.show_on_stderr);
    False when it belongs to none known (no shell yet, a stock task, a bare future:
    logged)."""
    from IPython import get_ipython

    from trikernel.user import tracebacks  # IPython's: loaded once the user side is

    shell = get_ipython()
    request = _request_of(context)
    if shell is None or request is None:
        return False
    token = current_request.set(request)
    try:
        exc = context.get("exception")
        if exc is None:
            print(_header(context), file=sys.stderr, flush=True)
            return True
        hide = bool(getattr(shell.InteractiveTB, "skip_hidden", True))
        tracebacks.show_on_stderr(_header(context), exc, exc.__traceback__, hide=hide)
        return True
    finally:
        current_request.reset(token)


def _handler(loop: Any, context: dict[str, Any]) -> None:
    """The loop's exception handler: never raises into the loop."""
    try:
        if not _show_in_cell(context):
            asyncio.BaseEventLoop.default_exception_handler(loop, context)  # stock: logged
    except Exception:
        log.exception("asyncio error could not be shown: %s", context.get("message"))
