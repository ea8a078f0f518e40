"""asyncio as plain Python has it in a sync cell: no running loop, ``asyncio.run`` works.

Runs on: the thread of any user run (main thread, subshells); :func:`install`
once per process, on the main thread, before user code runs.

A cell with no top-level ``await`` is a *sync cell*: aioloop.py runs every
cell that awaits under the driver (aiodrive.py), so a sync cell is the code
of the run's cells task that the driver does not step (the kernel's own
code in that task between cells too). Plain Python runs such code with no
event loop running, and so does trikernel (docs/trio.md, "asyncio beside
trio"):

- ``asyncio.get_running_loop()`` raises "no running event loop", so
  ``asyncio.run(main())``, ``asyncio.Runner`` and
  ``asyncio.new_event_loop().run_until_complete(...)`` work: they run a
  fresh stock asyncio loop on this thread, with trio's run context hidden
  meanwhile (:func:`outside_trio`), and library code that asks "is a loop
  running here?" before it calls ``asyncio.run`` takes the plain path.
  ipykernel refuses ``asyncio.run`` ("cannot be called from a running event
  loop"), one of its most-reported complaints.
- ``asyncio.get_event_loop()`` returns the kernel's loop (of this run), and
  ``asyncio.create_task()`` / ``ensure_future()`` schedule on it: the task
  starts when the cell ends and keeps running, as in ipykernel. Plain
  Python's ``create_task`` would raise here; a notebook cell that starts a
  task is the common case (issue 24), so it does not.

A cell that awaits runs inside the kernel's loop (aiodrive.py), as code in
an ``async def`` does: there a loop is running and ``asyncio.run`` raises
as in plain Python.

What this patches, process-wide: ``asyncio.get_running_loop`` /
``_get_running_loop`` (the kernel's loop hidden only from the cells task's
own undriven code; callbacks and tasks the loop runs see it),
``asyncio.create_task``, and trio-asyncio's policy's ``new_event_loop`` /
``set_event_loop`` (trio-asyncio refuses a new loop in trio context, and
``set_event_loop`` there replaced the kernel's loop for the cell's task).
trio-asyncio also makes ``new_event_loop()`` outside trio (``asyncio.run``
in a worker thread, as ``trio.to_thread.run_sync(asyncio.run, ...)``) a
loop that runs trio itself: :func:`install` gives such threads stock
asyncio back. Internals: ``trio_asyncio._loop`` (``_new_run_get``,
``_FakedPolicy``, ``_TrioPolicy``, ``_trio_policy``), trio's ``GLOBAL_RUN_CONTEXT``; checked
at import (:data:`UNSUPPORTED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import types
from typing import TYPE_CHECKING, Any

import sniffio
import trio

from trikernel.user import aiodrive

if TYPE_CHECKING:
    from collections.abc import Iterator

try:
    from trio._core._run import GLOBAL_RUN_CONTEXT as _RUN_CONTEXT
    from trio_asyncio import _loop as _ta_loop
    from trio_asyncio._base import BaseTrioEventLoop

    _ta_get_running: Any = _ta_loop._new_run_get
    _FakedPolicy: Any = _ta_loop._FakedPolicy
    _TrioPolicy: Any = _ta_loop._TrioPolicy
    _ = (_TrioPolicy.new_event_loop, _TrioPolicy.set_event_loop, _ta_loop._trio_policy)
    UNSUPPORTED: str | None = None
except (ImportError, AttributeError) as exc:  # pragma: no cover - another trio-asyncio
    UNSUPPORTED = f"trio-asyncio or trio lacks what sync cells use ({exc})"

_state = threading.local()  # .main: the trio task that runs this thread's cells (its run's main task)


def set_cells_task(task: trio.lowlevel.Task | None) -> None:
    """The trio task that runs this thread's cells, one after the other (the
    user run's main task; aioloop.open_kernel_loop sets it, None at close).
    Its code, when not under the driver, is a sync cell's (or the kernel's
    own between cells)."""
    _state.main = task


def in_sync_cell() -> bool:
    """The caller runs in a sync cell: code of the thread's cells task that the
    driver does not step (aiodrive.run_mixed steps every cell that awaits)."""
    main = getattr(_state, "main", None)
    if main is None:
        return False
    try:
        task = trio.lowlevel.current_task()
    except RuntimeError:  # trio hidden (outside_trio) or not in trio
        return False
    return task is main and aiodrive.driving_task() is not task


@contextlib.contextmanager
def outside_trio() -> Iterator[None]:
    """Hide this thread's trio run (the task and runner trio keeps per thread)
    and sniffio's "trio", so asyncio and trio-asyncio see a thread with no loop.

    For synchronous code only: no trio code may run on this thread meanwhile.
    Other threads' ``run_sync_soon`` still queue, and trio's SIGINT handler
    still works (it holds the runner itself; a cell's code is not
    KI-protected, so the interrupt is raised in place). Re-entrant.
    """
    saved = {k: getattr(_RUN_CONTEXT, k) for k in ("task", "runner") if hasattr(_RUN_CONTEXT, k)}
    if not saved:
        yield
        return
    for k in saved:
        delattr(_RUN_CONTEXT, k)
    previous, sniffio.thread_local.name = sniffio.thread_local.name, None
    try:
        yield
    finally:
        sniffio.thread_local.name = previous
        for k, v in saved.items():
            setattr(_RUN_CONTEXT, k, v)


def _get_running_loop() -> Any:
    """``asyncio._get_running_loop``: trio-asyncio's answer (the loop of the
    trio task's context), except None for the kernel's loop in a sync cell."""
    loop = _ta_get_running()
    if loop is not None and isinstance(loop, BaseTrioEventLoop) and in_sync_cell():
        return None
    return loop


def _get_running_loop_or_raise() -> Any:
    """``asyncio.get_running_loop``."""
    loop = _get_running_loop()
    if loop is None:
        raise RuntimeError("no running event loop")
    return loop


_orig_create_task: Any = asyncio.tasks.create_task


def _create_task(coro: Any, **kwargs: Any) -> Any:
    """``asyncio.create_task``; in a sync cell, on the kernel's loop (module docstring)."""
    if in_sync_cell():
        loop = _ta_get_running()
        if loop is not None:
            return loop.create_task(coro, **kwargs)
    return _orig_create_task(coro, **kwargs)


_unix_loop: Any = asyncio.SelectorEventLoop


class NestedLoop(_unix_loop):  # type: ignore[misc]
    """What ``asyncio.new_event_loop()`` gives a sync cell: a stock loop whose
    ``run_forever`` / ``run_until_complete`` hide trio while they run
    (:func:`outside_trio`), so ``asyncio.run`` and ``asyncio.Runner`` work
    as in plain Python. The cell's thread only."""

    def run_forever(self) -> None:
        """``asyncio.BaseEventLoop.run_forever``, outside trio."""
        with outside_trio():
            super().run_forever()

    def run_until_complete(self, future: Any) -> Any:
        """``asyncio.BaseEventLoop.run_until_complete``, outside trio."""
        with outside_trio():
            return super().run_until_complete(future)


_installed = False


def install() -> None:
    """Patch asyncio and trio-asyncio (module docstring), once per process;
    main thread, before any user code."""
    global _installed
    if _installed or UNSUPPORTED is not None:
        return
    _installed = True
    # outside trio, threads that set no policy get stock asyncio (a class-level default of the thread-local)
    _FakedPolicy.policy = asyncio.DefaultEventLoopPolicy()
    for module in (asyncio, asyncio.events):
        module._get_running_loop = _get_running_loop  # type: ignore[attr-defined]
        module.get_running_loop = _get_running_loop_or_raise  # type: ignore[attr-defined]
    asyncio.create_task = asyncio.tasks.create_task = _create_task
    new_event_loop, set_event_loop = _TrioPolicy.new_event_loop, _TrioPolicy.set_event_loop

    def policy_new_event_loop(self: Any) -> Any:
        if in_sync_cell():
            return NestedLoop()
        return new_event_loop(self)

    def policy_set_event_loop(self: Any, loop: Any) -> None:
        # a sync cell's set_event_loop (asyncio.Runner's too) is the thread's
        # loop for code outside trio; the kernel's loop stays this task's
        if in_sync_cell() and not isinstance(loop, BaseTrioEventLoop):
            with outside_trio():
                asyncio.get_event_loop_policy().set_event_loop(loop)
            return
        set_event_loop(self, loop)

    _TrioPolicy.new_event_loop = policy_new_event_loop
    _TrioPolicy.set_event_loop = policy_set_event_loop
    # nest_asyncio.apply() replaces get_event_loop on the policy's class with
    # one that knows no trio context (it then returned None in a sync cell):
    # the instance keeps trio-asyncio's, the kernel's loop of this run
    policy = _ta_loop._trio_policy
    policy.get_event_loop = types.MethodType(type(policy).get_event_loop, policy)
