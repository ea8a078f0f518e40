"""The driver of the user trio run: plain, as ``trio.run``, or a guest of a GUI loop.

Runs on: the main thread. :func:`run` blocks it for the user run's life
(userrun.py calls it instead of ``trio.run``); :meth:`GuestRun.use_host`
is called inside the run (``%gui``, guiloop.py).

One trio run, two ways of driving it (docs/design.md, "GUI event loops"):

- **plain**: trio's own loop, exactly as ``trio.run`` drives it: run a
  batch of tasks, then block in the I/O manager (epoll) on the main thread
  until the next event or deadline. Nothing else runs between batches.
- **hosted**: trio's guest mode (``trio.lowlevel.start_guest_run``): a GUI
  event loop (Tk, Qt: a :class:`Host`) owns the main thread; each batch of
  trio tasks runs as one of its callbacks, and trio's blocking wait for I/O
  runs in a trio worker thread, which posts the next batch to the host when
  an event or deadline arrives. GUI events, trio tasks and cells share the
  main thread with no polling interval.

A run started by ``trio.run`` cannot later become a guest, nor the other way
round, and guest mode costs a thread hop on every wake-up of the run (an
execute round trip is one), so the plain run would be slower if it were
always a guest. This module therefore drives trio's run generator itself:
it is what both ``trio.run`` and ``start_guest_run`` drive (``unrolled_run``
in ``trio._core._run``: yields a timeout, is sent the I/O events). Between
two batches the generator holds the whole run's state (tasks, nurseries,
deadlines, the TrioToken); the driver can stop driving it one way and go on
the other way, so the user nursery, its tasks and the run's token survive
``%gui tk`` and ``%gui``. The switch takes effect when the batch that asked
for it ends (the cell's next await or its end).

This uses trio internals (``setup_runner``, ``unrolled_run``, ``Runner``'s
guest fields), stable from trio 0.24 to 0.35: :data:`UNSUPPORTED` says why
they are missing in another version, and then :func:`run` is ``trio.run``
and ``%gui`` answers with that reason. The guest tick below follows trio's
own ``GuestState.guest_tick``.

Interrupts: trio installs its SIGINT handler the same way in both modes.
While the host loop runs (no batch running) the main thread is in C code of
the GUI toolkit; the signal's wake-up fd is trio's, so trio's I/O thread
wakes, posts a batch to the host, and the handler runs in Python there: host
code counts as KeyboardInterrupt-protected, so trio delivers the interrupt
to the main task at its next checkpoint (a cell awaiting, or the idle
``receive``), as in the plain run. A cell running sync code is interrupted
in place, as in the plain run. trio's I/O thread is started with SIGINT
blocked, so a process-directed SIGINT still reaches the main thread.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, Protocol

import outcome
import sniffio
import trio

from trikernel.threads import not_traced

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

log = logging.getLogger("trikernel.guestrun")

try:  # trio's run generator and runner set-up: internals (see the module docstring)
    from trio._core import _run as _trio_run

    _setup_runner: Any = _trio_run.setup_runner
    _unrolled_run: Any = _trio_run.unrolled_run
    _fields = {f.name for f in _trio_run.Runner.__attrs_attrs__}
    if list(inspect.signature(_setup_runner).parameters)[:4] != [
        "clock",
        "instruments",
        "restrict_keyboard_interrupt_to_checkpoints",
        "strict_exception_groups",
    ] or list(inspect.signature(_unrolled_run).parameters)[:3] != ["runner", "async_fn", "args"]:
        raise TypeError("setup_runner/unrolled_run signatures changed")
    _missing = {"is_guest", "guest_tick_scheduled", "io_manager", "main_task_outcome"} - _fields
    if not hasattr(_trio_run.Runner, "force_guest_tick_asap"):
        _missing.add("force_guest_tick_asap")
    if _missing:
        raise TypeError(f"trio's Runner has no {sorted(_missing)}")
    UNSUPPORTED: str | None = None
except Exception as exc:  # any mismatch: drive with trio.run, GUI loops unavailable
    UNSUPPORTED = f"trio {trio.__version__} does not have the run internals GUI hosting uses ({exc})"


class Host(Protocol):
    """A GUI event loop that can host the user trio run (guiloop.py).

    ``run_sync_soon_threadsafe(fn)``: have the host call ``fn()`` on the main
    thread soon; any thread may call it, it never blocks.
    ``run_sync_soon_not_threadsafe(fn)``: the same, called on the main thread.
    ``loop()``: run the host's event loop on the main thread until
    ``stop_loop()`` is called (from one of the host's callbacks).
    ``name``: what ``%gui`` calls it (``"tk"``, ``"qt"``).
    """

    name: str

    def run_sync_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Have the host call ``fn()`` on the main thread soon, from its event loop. Any thread
        may call it (trio's I/O thread does, with the next batch of tasks); it never blocks
        and must not raise for a running host."""

    def run_sync_soon_not_threadsafe(self, fn: Callable[[], object]) -> None:
        """The same as :meth:`run_sync_soon_threadsafe`, called on the main thread only (from a
        batch or another host callback); ``fn`` runs later, from the loop, never inside this
        call. May raise if the host cannot take it; then nothing is queued."""

    def loop(self) -> None:
        """Run the host's event loop on the main thread until :meth:`stop_loop` is called (from
        one of the host's callbacks); the driver enters it again while the host still drives
        the run."""

    def stop_loop(self) -> None:
        """Make :meth:`loop` return once the current callback has returned. Main thread, from a
        host callback."""


_current: GuestRun | None = None


def current() -> GuestRun | None:
    """The driver of the run on the main thread, or None (not started, or
    driven by plain ``trio.run`` because of :data:`UNSUPPORTED`)."""
    return _current


def run(async_fn: Callable[..., Any], *args: Any) -> Any:
    """``trio.run(async_fn, *args)`` whose driving can move onto a GUI loop.

    On the main thread: a :class:`GuestRun`, found by :func:`current` while
    it runs. On another thread (a GUI loop can only own the main thread),
    or without the trio internals (:data:`UNSUPPORTED`): ``trio.run``.
    Returns what ``async_fn`` returns, raises what it raises (trio.run's
    contract; TrioInternalError for trio's own bugs).
    """
    if threading.current_thread() is not threading.main_thread():
        return trio.run(async_fn, *args)
    if UNSUPPORTED is not None:
        log.info("%s: plain trio.run", UNSUPPORTED)
        return trio.run(async_fn, *args)
    return GuestRun().run(async_fn, *args)


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """Block SIGINT in the calling thread for the block's duration, so
    threads started inside inherit a mask with SIGINT blocked (a
    process-directed SIGINT must reach the main thread, docs/design.md)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class GuestRun:
    """Drives one trio run on the main thread, plain or hosted by a :class:`Host`.

    State between two batches of tasks: either ``_timeout`` (the generator
    yielded it and is owed the I/O events of a wait that long) or, while
    hosted, exactly one of: a batch posted to the host, a wait in trio's
    I/O thread (which posts the batch when it returns). Never both, so a
    batch never runs inside another (a nested GUI loop in a cell finds no
    batch to run: trio waits for the cell, as it does in the plain run).
    """

    def __init__(self) -> None:
        self.host: Host | None = None  # the host driving the run now (None: plain)
        self._wanted: Host | None = None  # the host asked for; applied when the batch ends
        self._runner: Any = None
        self._gen: Any = None
        self._timeout: float | None = None
        self._next_send: outcome.Outcome[Any] = outcome.Value(None)
        self._done = False
        self._internal_error: BaseException | None = None

    # -- inside the run (main thread) --------------------------------------------
    def use_host(self, host: Host | None) -> None:
        """Drive the run with ``host`` (None: plain) from the end of the
        current batch of tasks on. Main thread, inside the run."""
        self._wanted = host
        runner = self._runner
        if runner is not None and runner.is_guest:
            # called from host code between batches: make a batch come soon
            runner.force_guest_tick_asap()

    @property
    def wanted(self) -> Host | None:
        """The host that drives the run once the current batch ends."""
        return self._wanted

    # -- main thread -------------------------------------------------------------
    def run(self, async_fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``async_fn(*args)`` to completion; see :func:`run`."""
        global _current
        if _current is not None or threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the user run's driver runs once, on the main thread")
        runner = _setup_runner(None, (), False, True)
        self._runner = runner
        self._gen = _unrolled_run(runner, async_fn, args)
        _current = self
        try:
            while not self._done:
                host = self._wanted
                if host is None:
                    self._drive_plain()
                else:
                    self._drive_hosted(host)
        finally:
            _current = None
            self.host = None
            if not self._done:  # an error of the driver itself: end trio's run, never leave it installed
                self._gen.close()
        if self._internal_error is not None:
            raise self._internal_error
        result = runner.main_task_outcome
        if isinstance(result, outcome.Value):
            return result.value
        raise result.error

    def _drive_plain(self) -> None:
        """trio.run's loop, until a host is wanted or the run ends."""
        runner, gen = self._runner, self._gen
        runner.is_guest = False
        self.host = None
        get_events = runner.io_manager.get_events
        prev, sniffio.thread_local.name = sniffio.thread_local.name, "trio"
        try:
            # a batch is owed when there is no timeout (the start, or a wait that ended hosted)
            timeout = self._next_send.send(gen) if self._timeout is None else self._timeout
            while self._wanted is None:
                timeout = gen.send(get_events(timeout))
            self._timeout = timeout
        except StopIteration:
            self._done = True
        finally:
            sniffio.thread_local.name = prev

    def _drive_hosted(self, host: Host) -> None:
        """Run ``host``'s loop with the run as its guest, until another host
        (or none) is wanted or the run ends."""
        runner = self._runner
        self.host = host
        runner.is_guest = True
        if self._timeout is None:
            runner.guest_tick_scheduled = True
            host.run_sync_soon_not_threadsafe(self._tick)
        else:
            timeout, self._timeout = self._timeout, None
            self._schedule_next(timeout)
        log.info("the user run is hosted by the %s event loop", host.name)
        # the loop returns once a batch asked for a switch or the run ended
        while not self._done and self._timeout is None:
            host.loop()
        log.info("the %s event loop no longer hosts the user run", host.name)

    def _tick(self) -> None:
        """Run one batch of trio tasks (a host callback, main thread)."""
        prev, sniffio.thread_local.name = sniffio.thread_local.name, "trio"
        try:
            timeout = self._next_send.send(self._gen)
        except StopIteration:
            self._finish()
            return
        except BaseException as exc:  # TrioInternalError: trio.run would raise it
            self._internal_error = exc
            self._finish()
            return
        finally:
            sniffio.thread_local.name = prev
        self._schedule_next(timeout)

    def _schedule_next(self, timeout: float) -> None:
        try:
            self._after_tick(timeout)
        except Exception:
            # the host could not take the next batch: without one posted the
            # run would stall for good, so the plain driver takes over
            assert self.host is not None
            log.exception("the %s event loop failed to host the user run; back to the plain run", self.host.name)
            self._wanted = None
            self._timeout = timeout
            self._runner.guest_tick_scheduled = False
            self.host.stop_loop()

    def _finish(self) -> None:
        self._done = True
        assert self.host is not None
        self.host.stop_loop()

    def _after_tick(self, timeout: float) -> None:
        """Schedule the next batch: now, or when trio's I/O wait returns
        (in a worker thread, so the host loop keeps the main thread)."""
        runner, host = self._runner, self.host
        assert host is not None
        if self._wanted is not host:  # a switch: the next driver owes the generator this wait
            self._timeout = timeout
            # until that wait starts the host may still run callbacks (Qt
            # finishes its batch of events): one that wakes a task must
            # wake the wait, as trio's guest mode does while it waits
            runner.guest_tick_scheduled = False
            host.stop_loop()
            return
        events = outcome.capture(runner.io_manager.get_events, 0)
        if timeout <= 0 or isinstance(events, outcome.Error) or events.value:
            self._next_send = events
            runner.guest_tick_scheduled = True
            host.run_sync_soon_not_threadsafe(self._tick)
            return
        runner.guest_tick_scheduled = False

        def wait_for_events() -> Any:  # trio's I/O thread
            not_traced(threading.current_thread())  # never stopped by the debugger
            # trio's thread cache may hand us a thread that another part of
            # the process started (trio.to_thread from a cell) without SIGINT
            # blocked: the inherited mask below covers new threads only
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            return runner.io_manager.get_events(timeout)

        def deliver(events: outcome.Outcome[Any]) -> None:  # trio's I/O thread
            def in_main_thread() -> None:
                self._next_send = events
                runner.guest_tick_scheduled = True
                self._tick()

            host.run_sync_soon_threadsafe(in_main_thread)

        with sigint_blocked():  # a thread started here inherits the mask
            trio.lowlevel.start_thread_soon(wait_for_events, deliver, name="trikernel-guest-io")
