"""Kernel subshells (JEP 91): more shells, each on its own thread, one namespace.

Threads: a subshell is a thread named ``trikernel-subshell-<id>`` running
its own trio run (:class:`SubshellRun`, a :class:`~trikernel.userrun.UserRun`
off the main thread), so top-level ``await`` works in its cells and they run
while the main shell is busy. The io run serves it like the main shell: its
sequential lane (core/lanes.py ``SequentialLane``) hands its requests, one at a time, to
its run through the same ``Job`` hand-off; comm messages sent over it run as
tasks of its run. All subshells share the one IPython shell, the user
namespace, the IOPub queue and the stdin bridge; what a running cell owns is
kept per subshell by lanestate.py. ``trikernel.nursery`` stays the main
run's.

:class:`SubshellRegistry` keeps the subshells' threads (deleted ones too,
until they end) and is owned by the io run (create, forget, interrupt,
stop; core/interfaces.py ``SubshellRuns``); which subshells exist is the
core's one list (core/lanes.py ``Lanes``). :meth:`SubshellRegistry.id_of_thread`
may be called from any thread (``%subshell``).

Interrupts (JEP 91: "handled at the kernel level"): ``interrupt_request``
interrupts the main shell and every busy subshell. ipykernel interrupts only
the main thread (a signal reaches no other thread). A subshell cell waiting
at a trio checkpoint gets KeyboardInterrupt there, as trio delivers it in
the main thread's run; a cell running Python code without checkpoints gets
it as an asynchronous exception once it has stayed in that code for
SYNC_INTERRUPT_DELAY; a blocking C call (``time.sleep``, a lock) returns
first, since only the main thread's system calls are broken by the signal.

Runs on: the io run (:class:`SubshellRegistry`: create, forget,
interrupt, stop); each :class:`SubshellRun` on its own thread;
``SubshellRegistry.id_of_thread`` from any thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import uuid
from typing import TYPE_CHECKING, Any

import trio

from trikernel.threads import not_traced
from trikernel.user import lanestate
from trikernel.user.userrun import (
    REDELIVER_DELAY,
    REDELIVER_MAX_DELAY,
    UserRun,
    raise_interrupt_in,
    thread_in_finalizer,
)

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.subshells")

#: Seconds a subshell cell must stay in one trio step (Python code with no
#: checkpoint) after an interrupt before it is raised there asynchronously.
#: No event says "the thread is still in user code": a sync cell never
#: yields, so we look again after this long.
SYNC_INTERRUPT_DELAY = 0.1
#: Seconds a busy subshell gets after an interrupt at shutdown.
INTERRUPT_GRACE = 1.0
THREAD_PREFIX = "trikernel-subshell-"


class _StepWatch(trio.abc.Instrument):
    """Counts the steps of a run's main task (where its cells run) and says
    whether one is under way (trio's Instrument API; subshell thread)."""

    def __init__(self) -> None:
        self.main: trio.lowlevel.Task | None = None
        self.stepping = False
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.main:
            self.stepping = True
            self.steps += 1

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.main:
            self.stepping = False


def _current_runner() -> Any:
    """trio's Runner of the calling thread's run, for ``deliver_ki``: trio has
    no public way to raise KeyboardInterrupt in a run off the main thread.
    None if this trio no longer has it (interrupts then only use the
    asynchronous exception)."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT

        runner = GLOBAL_RUN_CONTEXT.runner
    except (ImportError, AttributeError):
        return None
    return runner if callable(getattr(runner, "deliver_ki", None)) else None


class SubshellRun(UserRun):
    """A subshell's user run on its own thread (JEP 91 "child subshell").

    Created and driven by the io run: :meth:`start`, ``start_job_soon`` /
    ``start_task_soon`` (thread-safe, as for the main run), :meth:`stop`,
    :meth:`interrupt`. ``ready`` and ``ended`` are ``trio.Event``\\ s of the
    io run, set when the run takes jobs and when the thread is done.
    """

    on_main_thread = False

    def __init__(self, subshell_id: str):
        super().__init__()
        self.subshell_id = subshell_id
        self.ready = trio.Event()
        self.ended = trio.Event()
        #: delete_subshell_request came (io run writes; ``%subshell`` reads)
        self.deleted = False
        self._io_token = trio.lowlevel.current_trio_token()
        self._watch = _StepWatch()
        self._runner: Any = None
        self._interrupt_steps: int | None = None
        #: io run: raise the interrupt again (SubshellRegistry sets it to a
        #: second stage for this run); see :meth:`swallowed_interrupt`
        self.interrupt_again: Callable[[], None] | None = None
        # not traced: the debugger stops user code on the main thread only
        self.thread = not_traced(
            threading.Thread(target=self._thread_main, name=THREAD_PREFIX + subshell_id, daemon=True)
        )

    def start(self) -> None:
        """Start the thread (io run)."""
        self.thread.start()

    # -- the subshell's thread ----------------------------------------------------
    def _thread_main(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # SIGINT is the main thread's
        # set before trio.run: trio copies this context into every task of the run
        lanestate.current_lane.set(lanestate.LaneState(self.subshell_id))
        try:
            self.run(self._setup, lambda: self._tell_io(self.ready.set))
        except BaseException:
            log.exception("subshell %s failed", self.subshell_id)
        finally:
            self.stopped.set()
            self._tell_io(self.ended.set)

    def _setup(self, nursery: trio.Nursery) -> None:
        self._watch.main = trio.lowlevel.current_task()  # the run's main task serves the jobs
        trio.lowlevel.add_instrument(self._watch)
        self._runner = _current_runner()

    def swallowed_interrupt(self) -> bool:
        """The subshell's thread lost a KeyboardInterrupt to a finalizer (a
        weakref callback, a generator closed as it is collected; a
        ``__del__`` is waited out before the raise): have the io run raise
        it again, SYNC_INTERRUPT_DELAY on, if the cell is still in that
        step. Called on the subshell's thread (userrun._unraisable)."""
        again = self.interrupt_again
        if not self.busy or again is None or self._delivered <= 0:
            return False  # not ours: user code raised it (printed as Python prints it)
        self._delivered -= 1
        self._interrupt_steps = self._watch.steps
        log.info("subshell %s: interrupt raised inside a finalizer: raised again", self.subshell_id)
        self._tell_io(again)
        return True

    def _tell_io(self, fn: Callable[[], None]) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the io run has ended (shutdown)
            self._io_token.run_sync_soon(fn)

    # -- io run --------------------------------------------------------------------
    def interrupt(self) -> None:
        """Interrupt the running cell, if any (io run; module docstring).

        First as trio does for a protected main thread: KeyboardInterrupt is
        delivered to the run's main task at the checkpoint it waits at or
        reaches next. :meth:`interrupt_running_code`, SYNC_INTERRUPT_DELAY
        later, raises it in code that has not reached one.
        """
        if not self.busy:
            return
        self._interrupt_steps = self._watch.steps
        if self._runner is not None:
            self._runner.deliver_ki()

    def interrupt_running_code(self) -> bool:
        """Second stage of :meth:`interrupt` (io run): if the cell is still in
        the trio step it was in when interrupted, it is running Python code
        with no checkpoint: raise KeyboardInterrupt in the thread.

        Returns True when the thread is inside a ``__del__`` right now, where
        Python would print the exception and drop it: nothing is raised and
        the caller asks again later (SubshellRegistry._second_stage).
        """
        steps = self._interrupt_steps
        watch = self._watch
        ident = self.thread.ident
        with self._interrupt_lock:  # the cell cannot end between the check and the raise (_end_of_job)
            if steps is None or not self.busy or not watch.stepping or watch.steps != steps or ident is None:
                self._interrupt_steps = None
                return False
            if thread_in_finalizer(ident):
                return True
            self._interrupt_steps = None
            if self._runner is not None:
                self._runner.ki_pending = False  # delivered here instead, not again at the next checkpoint
            self._delivered += 1
            raise_interrupt_in(ident)
        log.info("subshell %s: raised KeyboardInterrupt in running code", self.subshell_id)
        return False


class SubshellRegistry:
    """The subshells of this kernel (io run, except where noted)."""

    def __init__(self) -> None:
        self._live: set[SubshellRun] = set()  # threads not yet ended (deleted ones included)
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """An io-run service: holds the nursery of the interrupts' second stage."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def create(self) -> SubshellRun:
        """A new subshell: a fresh UUID (JEP 91 leaves the form to the
        kernel; ipykernel uses uuid4 too), its thread started."""
        run = SubshellRun(str(uuid.uuid4()))
        run.interrupt_again = lambda: self._again(run)
        self._live.add(run)
        run.start()
        self._forget_when_ended(run)
        log.info("subshell %s created", run.subshell_id)
        return run

    def _forget_when_ended(self, run: SubshellRun) -> None:
        async def forget() -> None:
            await run.ended.wait()
            self._live.discard(run)

        if self._nursery is not None:
            self._nursery.start_soon(forget)

    def forget(self, subshell_id: str) -> None:
        """The subshell was deleted (the core's lane stops its run when it is
        done): ``%subshell`` no longer names its thread (io run)."""
        for run in self._live:
            if run.subshell_id == subshell_id:
                run.deleted = True

    def interrupt_busy(self) -> None:
        """Interrupt every busy subshell (``interrupt_request``)."""
        busy = [run for run in self._live if run.busy]
        for run in busy:
            run.interrupt()
        if busy and self._nursery is not None:
            self._nursery.start_soon(self._second_stage, busy)

    def _again(self, run: SubshellRun) -> None:
        """io run: a second stage for ``run`` alone (SubshellRun.swallowed_interrupt).
        Called through the io run's token, where an exception would crash
        the run: after shutdown closed the nursery there is nothing to do."""
        if self._nursery is not None:
            with contextlib.suppress(RuntimeError):  # the nursery is closed
                self._nursery.start_soon(self._second_stage, [run])

    async def _second_stage(self, runs: list[SubshellRun]) -> None:
        """SYNC_INTERRUPT_DELAY after an interrupt, raise it in the subshells
        still in running code; one inside a finalizer is asked again after
        REDELIVER_DELAY, doubling up to REDELIVER_MAX_DELAY, as the main
        thread's held interrupt is (userrun.UserRun._hold)."""
        await trio.sleep(SYNC_INTERRUPT_DELAY)
        delay = REDELIVER_DELAY
        while runs:
            runs = [run for run in runs if run.interrupt_running_code()]
            if runs:
                await trio.sleep(delay)
                delay = min(delay * 2, REDELIVER_MAX_DELAY)

    def stop_all(self) -> None:
        """Shutdown: every subshell ends after its current request."""
        for run in self._live:
            run.stop()

    async def wait_stopped(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for every subshell thread to end;
        interrupt those still busy and wait INTERRUPT_GRACE more. Threads
        still running then (a blocking C call) are daemon threads: they end
        with the process."""
        with trio.move_on_after(grace):
            for run in list(self._live):
                await run.ended.wait()
        busy = [run for run in self._live if not run.ended.is_set()]
        if not busy:
            return
        log.warning("%d subshell(s) still running at shutdown; interrupting them", len(busy))
        for run in busy:
            run.interrupt()
        with trio.move_on_after(SYNC_INTERRUPT_DELAY + INTERRUPT_GRACE):
            await self._second_stage(list(busy))
            for run in busy:
                await run.ended.wait()

    # -- any thread ------------------------------------------------------------------
    def id_of_thread(self, ident: int | None) -> str | None:
        """The subshell id of thread ``ident``: None for the main thread,
        ``"unknown"`` for a thread that is no (listed) subshell's, as
        ipykernel (any thread)."""
        if ident == threading.main_thread().ident:
            return None
        for run in list(self._live):
            if run.thread.ident == ident and not run.deleted:
                return run.subshell_id
        return "unknown"


def register_magic(shell: Any, registry: SubshellRegistry, ids: Callable[[], list[str]]) -> None:
    """``%subshell``: which subshell runs this cell, and the subshells there
    are (``ids()``: the core's list, core/lanes.py); ipykernel 7's lines, in
    its order (user run of any lane)."""

    def subshell_magic(line: str = "") -> None:
        ident = threading.get_ident()
        print(f"subshell id: {registry.id_of_thread(ident)}")
        print(f"thread id: {ident}")
        print(f"main thread id: {threading.main_thread().ident}")
        print(f"pid: {os.getpid()}")
        print(f"thread count: {threading.active_count()}")
        print(f"subshell list: {ids()}")

    shell.register_magic_function(subshell_magic, "line", "subshell")
