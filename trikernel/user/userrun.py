"""The user trio run on the main thread, and the hand-off of jobs into it.

Runs on: the main thread. :meth:`UserRun.run` blocks the main thread in one
trio run for the kernel's life (docs/design.md, "Threads and loops"),
driven as ``trio.run`` drives it or, after ``%gui tk``/``qt``, as a guest
of that GUI's event loop (guestrun.py; the same run, moved);
everything else here runs inside that run, except the methods marked
*thread-safe*, which the io run calls.

Two lanes come in from the io run (core/kernelcore.py):

- *sequential* jobs (execute, complete, inspect, is_complete, history): the
  run's main task takes one at a time and awaits it right there, so
  top-level ``await`` in a cell runs in the main task and trio delivers
  KeyboardInterrupt to it;
- *concurrent* jobs (comm messages from the frontend, comm_info, the
  debugger's): each runs as a task of its own in the user nursery, so a
  widget's ``on_msg`` runs while an async cell awaits; one task
  (:meth:`UserRun._serve_concurrent`) starts them in the order they were
  handed over, each once the one before has ended, so a widget's messages
  reach ``on_msg`` in the order the frontend sent them (trio starts tasks
  spawned together in no fixed order).

Hand-off io run → user run: ``TrioToken.run_sync_soon`` of this run
(non-blocking, thread-safe). Completion user run → io run: the job's
``trio.Event`` set through the io run's token. No run ever blocks on the
other. The io side bounds jobs in flight (one sequential per lane, a
limiter for concurrent ones), so the buffers here never overflow.

Interrupts (messaging spec "Kernel interrupt"): SIGINT on the main thread,
whichever interrupt mode is used. trio's handler turns it into
KeyboardInterrupt in the running cell. User code may replace the SIGINT
disposition (``SIG_IGN``, ``SIG_DFL``, a handler of its own): trio's handler
is put back before and after every job, so the change lasts at most until
the end of the request that made it; a kernel started with SIGINT ignored
(``nohup``) or blocked handles it anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

import trio

from trikernel.core.job import Job
from trikernel.errors import KernelShuttingDown
from trikernel.user import guestrun, sigwatch

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    #: The user side's set-up, called in the user run with its nursery
    #: (UserRun.run); an awaitable it returns is awaited before jobs come.
    Setup = Callable[[trio.Nursery], Awaitable[None] | None]

log = logging.getLogger("trikernel.userrun")

#: Sequential jobs buffered in the user run (the io side keeps <= 1 in flight).
SEQ_BUFFER = 4
#: Seconds before an interrupt held because the main thread is inside a
#: ``__del__`` is tried again; the wait doubles at each try, up to
#: REDELIVER_MAX_DELAY, so a finalizer that never returns costs a few tries
#: a second, not a hundred.
REDELIVER_DELAY = 0.01
REDELIVER_MAX_DELAY = 0.2
_MAX_DOUBLINGS = 16  # 2**n stays a small float however long an interrupt is held


class _Stop:
    """End marker for the sequential lane."""


class UserRun:
    """Owns the user trio run on the main thread.

    State read from other threads: ``busy`` (a sequential job is running),
    ``stopping`` (stop() was called), ``stopped`` (a ``threading.Event``, set
    when the run has returned).
    """

    #: False for a run on another thread (a subshell, subshells.py): signals
    #: are the main thread's, so the SIGINT handling here is skipped
    on_main_thread = True

    def __init__(self) -> None:
        self.token: trio.lowlevel.TrioToken | None = None
        self.stopped = threading.Event()
        self.nursery: trio.Nursery | None = None
        self.busy = False
        self._concurrent = 0  # concurrent jobs (comm handlers) running now
        self.stopping = False
        self._send: trio.MemorySendChannel[tuple[Job, int] | _Stop] | None = None
        self._concurrent_send: trio.MemorySendChannel[Job] | None = None
        #: concurrent jobs queued so far, and those that have ended (or were
        #: refused): a sequential job waits for the ones queued before it
        #: (start_job_soon); they end in the order queued (_serve_concurrent)
        self._concurrent_queued = 0
        self._concurrent_ended = 0
        self._concurrent_progress = trio.lowlevel.ParkingLot()
        self._trio_sigint: Any = None  # trio's SIGINT handler (wrapped), once the run is up
        #: the watch for a SIGINT stuck before a blocking call (sigwatch.py), main run only
        self._sigwatch: sigwatch.SigintWatch | None = None
        #: held while deciding whether a job may be interrupted and raising it
        #: (interrupt), and while a job stops being interruptible
        #: (_end_of_job): an asynchronous KeyboardInterrupt is never raised in
        #: a job that has ended; one raised just before is taken right there
        #: (_take_late_interrupt), so never in its reply or in the scheduler
        self._interrupt_lock = threading.Lock()
        #: an interrupt of the running job is held because it came while the
        #: main thread was inside a ``__del__`` (_hold); cleared when it is
        #: delivered and when the job stops being interruptible, so a retry
        #: never reaches a later job
        self._held = False
        self._retry_pending = False  # a retry timer is running (_hold, _retry)
        self._retries = 0  # retries of the held interrupt so far (its back-off)
        #: the SIGINT in flight was sent by _retry, not asked for (the handler
        #: tells on_interrupt of asked-for interrupts only)
        self._resent = False
        #: SIGINTs sent by interrupt(), and how many of them the handler has
        #: told on_interrupt of: one that merged with a resend still counts
        self._asked = 0
        self._told = 0
        #: KeyboardInterrupts this run raised into the running job and not yet
        #: seen lost (swallowed_interrupt): only those are sent again, never
        #: one that user code raised itself inside a finalizer
        self._delivered = 0
        #: called (main thread, from the SIGINT handler or interrupt()) on every
        #: interrupt of this run, before it is delivered: the kernel interrupts
        #: its busy subshells there. Must be quick and must not raise.
        self.on_interrupt: Callable[[], None] | None = None

    # -- thread-safe: called from the io run ------------------------------------
    def start_job_soon(self, job: Job) -> None:
        """Queue a sequential job (thread-safe, non-blocking). It runs after
        the concurrent jobs queued before it (:meth:`start_task_soon`) have
        ended, so a cell sees the comm messages sent before it, as with
        ipykernel's one shell queue.

        Raises KernelShuttingDown when the user run is not (or no longer)
        running.
        """
        send = self._send
        if self.token is None or send is None:
            raise KernelShuttingDown("the user run is not running")
        if self.stopping:  # queued behind the _Stop marker it would never run
            raise KernelShuttingDown("the user run is stopping")
        try:
            self.token.run_sync_soon(self._queue_job, send, job)
        except trio.RunFinishedError:
            raise KernelShuttingDown("the user run has ended") from None

    def start_task_soon(self, job: Job) -> None:
        """Queue a concurrent job (thread-safe, non-blocking): it runs as a
        task of the user nursery, after the concurrent jobs queued before it
        (:meth:`_serve_concurrent`). A job the run can no longer start is
        finished with KernelShuttingDown.

        Raises KernelShuttingDown when the user run is not running.
        """
        if self.token is None or self._concurrent_send is None:
            raise KernelShuttingDown("the user run is not running")
        try:
            self.token.run_sync_soon(self._queue_concurrent, self._concurrent_send, job)
        except trio.RunFinishedError:
            raise KernelShuttingDown("the user run has ended") from None

    def _queue_job(self, send: trio.MemorySendChannel[tuple[Job, int] | _Stop], job: Job) -> None:
        """(user run, through its token) Queue ``job`` for :meth:`_serve_jobs`,
        with the number of concurrent jobs queued before it."""
        send.send_nowait((job, self._concurrent_queued))

    def _queue_concurrent(self, send: trio.MemorySendChannel[Job], job: Job) -> None:
        """(user run, through its token) Queue ``job`` for :meth:`_serve_concurrent`."""
        try:
            send.send_nowait(job)
        except (trio.BrokenResourceError, trio.ClosedResourceError):  # the run is stopping
            job.refuse("the user run has stopped")
            return
        self._concurrent_queued += 1

    def _concurrent_over(self) -> None:
        """(user run) One more concurrent job ended, or was refused."""
        self._concurrent_ended += 1
        self._concurrent_progress.unpark_all()

    def stop(self) -> None:
        """Ask the user run to cancel the user nursery and return (thread-safe)."""
        self.stopping = True
        if self.token is None or self._send is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._send.send_nowait, _Stop())

    def interrupt(self) -> None:
        """Interrupt the user code running on the main thread (thread-safe).

        Sends SIGINT to the main thread (``pthread_kill``), where trio's
        handler turns it into KeyboardInterrupt. If the running cell set
        SIGINT to ``SIG_DFL`` or ``SIG_IGN`` itself, a signal would kill the
        kernel or do nothing: then KeyboardInterrupt is raised in the main
        thread as an asynchronous exception instead (it lands at the next
        Python bytecode, not inside a blocking C call). While no job (cell or
        comm handler) runs it is ignored (busy subshells still get it), so it never
        lands in a cell that starts after it; a signal-mode SIGINT is
        treated the same by the handler.
        """
        main = threading.main_thread().ident
        assert main is not None
        with self._interrupt_lock:  # the job cannot end between the check and the raise
            if not self._interruptible:
                how = "idle"
            elif _sigint_disabled():
                how = "async"
                if thread_in_finalizer(main):
                    self._hold()  # raised there, Python would print it and drop it
                else:
                    self._delivered += 1
                    raise_interrupt_in(main)
            else:
                how = "signal"  # the handler checks again when it runs (_wrap_sigint)
                self._asked += 1
                signal.pthread_kill(main, signal.SIGINT)
        if how == "idle":
            self._ignore_idle_interrupt()
        elif how == "async":
            log.warning("SIGINT is disabled by user code; raised KeyboardInterrupt in the main thread instead")
            if self.on_interrupt is not None:
                self.on_interrupt()

    # -- main thread -------------------------------------------------------------
    def run(self, setup: Setup, on_ready: Callable[[], None]) -> None:
        """Run the user trio run until stop(); blocks the main thread.

        ``setup(nursery)`` runs first (IPython is loaded there); what it
        returns, if not None, is awaited next (tasks that must be running
        before the first job, such as the user nursery's host); then
        ``on_ready()`` tells the io side that jobs may be submitted.
        """
        if self.on_main_thread:
            _enable_sigint()
        ident = threading.get_ident()
        _runs[ident] = self
        _install_unraisable_hook()
        try:
            # trio.run, except that %gui can move the run onto a GUI event loop and back
            guestrun.run(self._main, setup, on_ready)
        except BaseException as exc:
            # jupyter_client interrupts before it shuts a kernel down; an
            # interrupt that lands while the user run winds down (bare, or
            # raised out of the closing nursery as a group) is harmless.
            if not (self.stopping and _only_interrupts(exc)):
                raise
        finally:
            _runs.pop(ident, None)

    def swallowed_interrupt(self) -> bool:
        """This run's thread just lost a KeyboardInterrupt to a finalizer
        (``sys.unraisablehook``: a ``__del__``, a weakref callback, a
        generator closed as it is collected); called on that thread.
        Returns True if it will be delivered again (a job runs and this run
        raised a KeyboardInterrupt into it that has not been seen lost yet:
        the main thread holds it, :meth:`_hold`), so the hook does not print
        it. A KeyboardInterrupt user code raises itself in a finalizer is
        left to Python, unless it comes after an interrupt the cell caught
        and went on from, in the same cell (then it is taken for that one)."""
        if not self._interruptible or self._delivered <= 0:
            return False  # not ours: user code raised it (printed as Python prints it)
        self._delivered -= 1
        log.info("interrupt raised inside a finalizer: sent again once it is over")
        self._hold()
        return True

    async def _main(self, setup: Setup, on_ready: Callable[[], None]) -> None:
        # imported here, in the user run: the io run answers kernel_info meanwhile
        from trikernel.user import aioloop

        if self.on_main_thread:
            self._trio_sigint = self._wrap_sigint(signal.getsignal(signal.SIGINT))  # trio.run installed it
            self._sigwatch = sigwatch.SigintWatch.start(lambda: self._interruptible)
        send, recv = trio.open_memory_channel[tuple[Job, int] | _Stop](SEQ_BUFFER)
        # bounded by the io side (core/kernelcore.py CONCURRENT_LIMIT), so never full
        concurrent_send, concurrent_recv = trio.open_memory_channel[Job](math.inf)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                # the run's asyncio loop (aioloop.py), opened in this main task so
                # that cells and every task spawned from here on see it; closed
                # (its tasks cancelled, their finally blocks run) before the
                # nursery is cancelled
                async with aioloop.kernel_loop():
                    nursery.start_soon(self._serve_concurrent, concurrent_recv, nursery)
                    self._concurrent_send = concurrent_send
                    if self.on_main_thread:
                        await _protected_setup(setup, nursery)
                    else:
                        await _set_up(setup, nursery)
                    self._send = send
                    self.token = trio.lowlevel.current_trio_token()
                    if self.stopping:
                        # stop() came while IPython was loading (no token then):
                        # it could not queue _Stop, so the run stops itself
                        send.send_nowait(_Stop())
                    on_ready()
                    await self._serve_jobs(recv)
                nursery.cancel_scope.cancel()
        finally:
            watch, self._sigwatch = self._sigwatch, None
            if watch is not None:
                watch.close()  # trio's wakeup fd back before trio closes it
            self.stopped.set()

    @trio.lowlevel.enable_ki_protection
    async def _serve_jobs(self, recv: trio.MemoryReceiveChannel[tuple[Job, int] | _Stop]) -> None:
        """The sequential lane. KI-protected glue: an interrupt that arrives
        between jobs is delivered at the next checkpoint (inside the next
        job's code, or here while idle, where it is ignored), never in the
        middle of a hand-off. A job starts once the concurrent jobs queued
        before it have ended (:meth:`start_job_soon`)."""
        while True:
            try:
                item = await recv.receive()
            except KeyboardInterrupt:
                log.info("interrupt while idle: ignored")
                continue
            if isinstance(item, _Stop):
                return
            job, concurrent_before = item
            while self._concurrent_ended < concurrent_before:
                try:
                    await self._concurrent_progress.park()
                except KeyboardInterrupt:  # meant for the comm handler running now, which has it or ended
                    log.info("interrupt while a job waited for the comm handlers before it: ignored")
            self._restore_sigint()
            self.busy = True
            try:
                await job.run(before_done=self._end_of_job)
            finally:
                self.busy = False

    def _end_of_job(self) -> None:
        """Right after a sequential job's code returned, before its reply can
        leave (the reply may leave from this thread: Job.run): trio's SIGINT
        handler is back, and an interrupt from now on belongs to no job, so
        it is ignored, never held for the next one."""
        self._restore_sigint()
        try:
            with self._interrupt_lock:
                self.busy = False
                self._delivered = 0  # raised into this job: spent, even if a comm handler still runs
                self._drop_held_if_idle()
            _take_late_interrupt()
        except KeyboardInterrupt:
            self.busy = False
            log.info("interrupt raised as the job ended: ignored")

    def _wrap_sigint(self, trio_handler: Any) -> Any:
        """Install a SIGINT handler that calls :attr:`on_interrupt`, then
        trio's (which sees the interrupted frame, so its KI protection holds):
        a signal-mode interrupt reaches the subshells too."""
        if not callable(trio_handler):
            return trio_handler

        def handler(signum: int, frame: Any) -> None:
            watch = self._sigwatch
            if watch is not None:
                watch.handler_ran()  # this SIGINT is not stuck (sigwatch.py)
            asked = self._asked
            fresh, self._told = asked != self._told, asked
            resent, self._resent = self._resent, False
            # a SIGINT from outside (signal mode) that merges with a resend in
            # the signal mask counts once, as two SIGINTs do in any process
            new = fresh or not resent
            if not self._interruptible:
                if new:
                    self._ignore_idle_interrupt()
                return
            if self.on_interrupt is not None and new:
                self.on_interrupt()
            if _in_finalizer(frame):
                # trio counts a __del__ frame as KI-protected and would hold
                # the interrupt to the next checkpoint, which a cell in sync
                # code never reaches: send it again once the finalizer is over
                self._hold()
                return
            self._held = False
            self._retries = 0
            self._delivered += 1
            trio_handler(signum, frame)

        signal.signal(signal.SIGINT, handler)
        return handler

    def _hold(self) -> None:
        """Hold the running job's interrupt: the main thread is inside a
        finalizer (a ``__del__`` frame, or one that lost the interrupt:
        :meth:`swallowed_interrupt`). A timer thread tries it again (:meth:`_retry`) after
        REDELIVER_DELAY, doubling up to REDELIVER_MAX_DELAY. Called with
        ``_interrupt_lock`` held, or from the main thread's SIGINT handler
        without it (the handler may run inside a block that holds it; the
        timer checks again under the lock)."""
        self._held = True
        if self._retry_pending:
            return  # the running timer tries this one too
        delay = min(REDELIVER_DELAY * 2 ** min(self._retries, _MAX_DOUBLINGS), REDELIVER_MAX_DELAY)
        self._retries += 1
        self._retry_pending = True
        with guestrun.sigint_blocked():  # a process SIGINT must not pick the timer's thread
            timer = threading.Timer(delay, self._retry)
            timer.daemon = True
            timer.start()

    def _retry(self) -> None:
        """Timer thread: deliver the held interrupt if the job still runs, the
        way :meth:`interrupt` would now (SIGINT, or the asynchronous
        KeyboardInterrupt if the job disabled SIGINT, held again while the
        main thread is still in a finalizer)."""
        main = threading.main_thread().ident
        assert main is not None
        with self._interrupt_lock:
            self._retry_pending = False
            if not (self._held and self._interruptible):
                self._held = False
                return
            if not _sigint_disabled():
                self._resent = True
                signal.pthread_kill(main, signal.SIGINT)  # the handler holds it again if need be
            elif thread_in_finalizer(main):
                self._hold()
            else:
                self._held = False
                self._retries = 0
                self._delivered += 1
                raise_interrupt_in(main)

    def _drop_held_if_idle(self) -> None:
        """With ``_interrupt_lock`` held, after a job stopped: a held
        interrupt belongs to no job once none runs."""
        if not self._interruptible:
            self._held = False
            self._retries = 0
            self._delivered = 0

    @trio.lowlevel.enable_ki_protection
    async def _serve_concurrent(self, recv: trio.MemoryReceiveChannel[Job], nursery: trio.Nursery) -> None:
        """The concurrent jobs, in the order they were queued: each in a task
        of its own (a fresh copy of this task's context, as any spawned
        task), the next once it has ended. Their bodies are synchronous
        handlers, so waiting costs the next one nothing but a task switch.

        Cancellation: at the run's end; jobs still queued then, and any
        queued later, are finished with KernelShuttingDown (the io run is
        told, never left waiting).
        """
        try:
            async for job in recv:
                ended = trio.Event()
                nursery.start_soon(self._run_concurrent, job, ended)
                await ended.wait()
        finally:
            while True:
                try:
                    job = recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                job.refuse("the user run stopped before this job ran")
                self._concurrent_over()
            recv.close()  # later ones: _queue_concurrent refuses them

    @trio.lowlevel.enable_ki_protection
    async def _run_concurrent(self, job: Job, ended: trio.Event) -> None:
        """A concurrent job (comm handler) as a task of the user nursery;
        while it runs an interrupt is delivered (it is the code running)."""
        self._concurrent += 1
        try:
            await job.run()
        finally:
            try:
                with self._interrupt_lock:
                    self._concurrent -= 1
                    self._drop_held_if_idle()
                _take_late_interrupt()
            except KeyboardInterrupt:
                log.info("interrupt raised as a comm handler ended: ignored")
            finally:
                ended.set()
                self._concurrent_over()

    @property
    def _interruptible(self) -> bool:
        """A sequential or concurrent job is running (read from any thread)."""
        return self.busy or self._concurrent > 0

    def _ignore_idle_interrupt(self) -> None:
        """An interrupt while no job runs: nothing of the main shell to stop.
        Busy subshells still get it (``on_interrupt``). Not handed to trio:
        trio would hold a SIGINT caught in KI-protected code until the next
        checkpoint, which may be inside the next cell (the cell was not
        running when the interrupt was asked for; found by the fuzzer)."""
        log.info("interrupt while idle: ignored")
        if self.on_interrupt is not None:
            self.on_interrupt()

    def _restore_sigint(self) -> None:
        """Put trio's SIGINT handler back if user code replaced it."""
        if self._trio_sigint is None:
            return
        current = signal.getsignal(signal.SIGINT)
        if current is not self._trio_sigint:
            signal.signal(signal.SIGINT, self._trio_sigint)
            log.info("SIGINT disposition was changed by user code (%r); restored so interrupts keep working", current)


#: The user run of each thread that runs one (main and subshells), by
#: thread ident: where _unraisable finds the run whose interrupt was lost.
_runs: dict[int, UserRun] = {}
_previous_unraisablehook: Callable[[Any], Any] | None = None
_hook_installed = False


def _install_unraisable_hook() -> None:
    """Chain :func:`_unraisable` in front of ``sys.unraisablehook``, once per
    process (the main run, before any user code): installed again by a
    subshell's run, it would chain itself behind a user hook that chains to
    it, and every unraisable exception then recursed until RecursionError
    (found by review). A hook user code puts in front later stays there."""
    global _previous_unraisablehook, _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    _previous_unraisablehook = sys.unraisablehook
    sys.unraisablehook = _unraisable


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook``: Python drops an exception raised where it
    cannot propagate (a finalizer, a weakref callback, a generator's
    ``finally`` run as it is collected) after printing "Exception ignored".
    A KeyboardInterrupt of a running job lost that way is delivered again
    (UserRun.swallowed_interrupt), not printed; anything else goes to the
    hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        run = _runs.get(threading.get_ident())
        if run is not None and run.swallowed_interrupt():
            return
    (_previous_unraisablehook or sys.__unraisablehook__)(unraisable)


def _in_finalizer(frame: Any) -> bool:
    """``frame`` or a caller of it is a ``__del__`` (main thread, SIGINT handler)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def thread_in_finalizer(ident: int) -> bool:
    """The thread ``ident`` is running a ``__del__`` now (any thread may ask).

    An asynchronous KeyboardInterrupt raised in a thread inside a finalizer
    lands in the finalizer, where Python prints "Exception ignored in" and
    drops it: the interrupt would be lost. The answer can be stale by the
    time the caller raises (the thread runs on), a window of a few bytecodes.
    """
    return _in_finalizer(sys._current_frames().get(ident))


def _sigint_disabled() -> bool:
    """User code set SIGINT to ``SIG_DFL``/``SIG_IGN``: a signal would kill
    the kernel or do nothing, so interrupts are raised asynchronously."""
    return signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, signal.SIG_IGN, None)


def raise_interrupt_in(ident: int) -> None:
    """Raise KeyboardInterrupt in thread ``ident`` at its next bytecode (any
    thread may call it; callers hold the run's interrupt lock, so the job
    cannot end between their check and the raise). Inside a blocking C call
    it lands when the call returns; inside a ``__del__`` it is lost, so
    callers ask :func:`thread_in_finalizer` first."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))


def _take_late_interrupt() -> None:
    """A Python call, made inside ``try``/``except KeyboardInterrupt`` right
    after a job stopped being interruptible: CPython delivers a pending
    asynchronous exception at the start of a Python function (its RESUME
    checks the eval breaker), so one raised just before the job ended
    (UserRun.interrupt holds the lock while it raises) lands here, where it
    is dropped, and not later in the reply or trio's scheduler. Not
    ``PyThreadState_SetAsyncExc(id, NULL)``: with nothing pending, CPython
    3.11 leaves the interpreter's async-exception signal set for good, and
    the debugger's tests then timed out."""


def _only_interrupts(exc: BaseException) -> bool:
    """True for KeyboardInterrupt, or a group holding nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[1] is None
    return isinstance(exc, KeyboardInterrupt)


async def _set_up(setup: Setup, nursery: trio.Nursery) -> None:
    opening = setup(nursery)
    if opening is not None:
        await opening


async def _protected_setup(setup: Setup, nursery: trio.Nursery) -> None:
    """Run the user side's set-up (IPython loads) with interrupts ignored.

    The io run answers kernel_info before IPython is loaded, so clients may
    interrupt that early; such an interrupt belongs to no cell. It is logged
    and dropped — it neither kills the starting kernel nor waits, pending,
    to interrupt the first cell.
    """
    previous = signal.signal(signal.SIGINT, _ignore_at_start_up)
    # cli.py blocked SIGINT before anything else: what arrived since is
    # delivered now, to the ignoring handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        await _set_up(setup, nursery)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ignore_at_start_up(signum: int, frame: object) -> None:
    log.info("interrupt while the kernel starts: ignored")


def _enable_sigint() -> None:
    """Main thread, before trio.run: make SIGINT reach Python.

    trio installs its handler only over Python's default one, so a kernel
    started with SIGINT ignored (``nohup cmd &``, as remote launchers do) or
    set to ``SIG_DFL`` would never see interrupts. SIGINT stays blocked
    (cli.py blocks it first thing, so an interrupt sent while the kernel
    starts cannot land before trio's handler is in place); the set-up
    unblocks it (_protected_setup).
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
