"""The cyclic garbage collector, run on the main thread: never on the io thread.

CPython's cyclic collector runs in whichever thread crosses its allocation
threshold (3.12+: whichever thread next looks for pending work), and runs
the ``__del__`` methods and weakref callbacks of the garbage it finds right
there. The io thread allocates for every message it serves, so while the
user run was idle the collector ran there: a user ``__del__`` that slept
3 s, in a reference cycle, held control, shell and IOPub for 3 s per object
(20 such objects: kernel_info on control unanswered for 60 s, where
ipykernel 7.4 answered within 0.1 s). Nothing of the user's may run on the
io thread (issue 26.2), and CPython has no per-thread switch for the
collector. So:

- automatic collection is off for the process (the real ``gc.disable``);
  ``gc.enable``, ``gc.disable`` and ``gc.isenabled`` are replaced by
  versions that record what user code asked for (``timeit``'s
  ``gc.disable()`` ... ``gc.enable()`` keeps its meaning, and
  ``gc.isenabled()`` says what was asked);
- the "trikernel-gc" thread looks at ``gc.get_count()`` every
  :data:`POLL_INTERVAL`; when a collection is due by CPython's own rule
  (:func:`due_generation`: generation 0 past its threshold, the oldest due
  generation collected, a full collection only once the heap grew by a
  quarter since the last one, as CPython's ``long_lived_pending`` rule, with
  ``sys.getallocatedblocks()`` as the measure), it asks the main thread to
  collect: ``Py_AddPendingCall``, which the interpreter runs on the main
  thread at its next bytecode, in a sync cell too, and a wake-up of the
  main user run (its trio token) for when it is idle;
- the main thread collects (``gc.collect(generation)``), so finalizers run
  where GUI objects (Tk, Qt) live, as in a plain Python script. If the main
  thread has not collected within :data:`FALLBACK_DELAY` (it is blocked in
  a long C call with the GIL released, while other threads allocate), the
  gc thread collects itself: never the io thread, and where CPython would
  have collected anyway (a thread other than the main one).

Cost: one ``gc.get_count()`` per POLL_INTERVAL on the gc thread (10 a
second while the kernel is idle); garbage lives up to POLL_INTERVAL longer
than with CPython's collector (generation 0 collections are fewer and
larger). ``%trikernel`` shows ``gc_main`` and ``gc_fallback``, the
collections run on each thread, and ``gc_requests``. ``gc.collect()`` by user code runs where
it is called, as always. A forked child (``os.fork``, multiprocessing's
fork) gets CPython's automatic collector back, as the user last asked.

Runs on: :meth:`Collector.start` on the main thread at start-up, before the
io thread and any user code; the poll on the "trikernel-gc" thread; the
collections on the main thread (or the gc thread, as said).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from trikernel.threads import PREFIX, not_traced

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.collector")

#: Seconds between two looks at the collector's counts (gc thread) while
#: objects are being made; it doubles up to POLL_INTERVAL_IDLE while fewer
#: than half a first threshold's worth were (an idle kernel wakes 10 times a second).
POLL_INTERVAL = 0.01
POLL_INTERVAL_IDLE = 0.1
#: Seconds the gc thread waits for the main thread to collect before it collects itself.
FALLBACK_DELAY = 0.5
#: A full collection waits until the heap grew by this share since the last one
#: (CPython: ``long_lived_pending > long_lived_total / 4``).
FULL_GROWTH = 0.25

_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING_CALL, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int


def due_generation(
    count: tuple[int, int, int], threshold: tuple[int, ...], blocks: int, blocks_at_full: int
) -> int | None:
    """The generation CPython's collector would collect now, or None.

    Args:
        count: ``gc.get_count()``.
        threshold: ``gc.get_threshold()`` (a first threshold of 0 turns
            automatic collection off, as in CPython).
        blocks: ``sys.getallocatedblocks()`` now.
        blocks_at_full: the same right after the last full collection.

    The oldest generation whose count is past its threshold, once
    generation 0 is; a full collection (2) only when the heap grew by
    FULL_GROWTH since the last one (CPython's rule against quadratic
    full collections of a growing heap).
    """
    t0 = threshold[0]
    if t0 == 0 or count[0] <= t0:
        return None
    t1 = threshold[1] if len(threshold) > 1 else 10
    t2 = threshold[2] if len(threshold) > 2 else 10
    if count[2] > t2 and blocks - blocks_at_full > blocks_at_full * FULL_GROWTH:
        return 2
    if count[1] > t1:
        return 1
    return 0


class Collector:
    """Runs CPython's cyclic collector on the main thread (module docstring).

    Args:
        wake: called (from the gc thread) to wake the main user run when a
            collection is due, e.g. ``lambda: token.run_sync_soon(noop)``;
            None until the user run has a token (:attr:`wake` may be set later).

    :attr:`statistics` counts collections by where they ran.
    """

    def __init__(self, wake: Callable[[], None] | None = None):
        self.wake = wake
        # the main thread and a fallback never collect at once; re-entrant: a
        # pending call can run inside a finalizer of the collection under way
        self._lock = threading.RLock()
        self._wanted = gc.isenabled()
        self._real_enable = gc.enable
        self._real_disable = gc.disable
        self._real_isenabled = gc.isenabled
        self._blocks_at_full = sys.getallocatedblocks()
        self._requested = threading.Event()  # a main-thread collection was asked for and not yet run
        self._done = threading.Event()
        self._stop = threading.Event()
        self._callback = _PENDING_CALL(self._pending_call)  # kept alive: the interpreter holds its address
        self._thread: threading.Thread | None = None
        self.statistics: dict[str, int] = {"main": 0, "fallback": 0, "requests": 0, "reenabled": 0}

    # -- set-up (main thread) ----------------------------------------------------------
    def start(self) -> None:
        """Turn automatic collection off, put the recording ``gc`` functions
        in place and start the gc thread. Idempotent per instance. Runs on: the main thread."""
        if self._thread is not None:
            return
        self._wanted = self._real_isenabled()
        self._real_disable()
        gc.enable = self._user_enable
        gc.disable = self._user_disable
        gc.isenabled = self._user_isenabled
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        self._thread = not_traced(threading.Thread(target=self._poll, name=PREFIX + "gc", daemon=True))
        self._thread.start()

    def stop(self) -> None:
        """Stop the gc thread and give CPython its automatic collector back, as the user last asked."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)
        self._restore()

    def _restore(self) -> None:
        gc.enable, gc.disable, gc.isenabled = self._real_enable, self._real_disable, self._real_isenabled
        if self._wanted:
            self._real_enable()

    def _after_fork_in_child(self) -> None:
        """A forked child has no gc thread: CPython collects there on its own again."""
        self._thread = None
        self._restore()

    # -- what user code calls -----------------------------------------------------------
    def _user_enable(self) -> None:
        """``gc.enable()``: automatic collection wanted (run by the gc thread's requests)."""
        self._wanted = True

    def _user_disable(self) -> None:
        """``gc.disable()``: no automatic collection until ``gc.enable()``."""
        self._wanted = False

    def _user_isenabled(self) -> bool:
        """``gc.isenabled()``: what user code last asked for."""
        return self._wanted

    # -- the gc thread ------------------------------------------------------------------
    def _poll(self) -> None:
        """Every POLL_INTERVAL (up to POLL_INTERVAL_IDLE while little is
        made): is a collection due? Then have the main thread run it."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # SIGINT is the main thread's
        interval = POLL_INTERVAL
        while not self._stop.wait(interval):
            try:
                self._poll_once()
                quiet = gc.get_count()[0] * 2 < gc.get_threshold()[0]
                interval = min(interval * 2, POLL_INTERVAL_IDLE) if quiet else POLL_INTERVAL
            except Exception:  # never end the thread: collection would stop for good
                log.exception("the collector's poll failed")

    def _poll_once(self) -> None:
        if self._real_isenabled():
            # a C extension called PyGC_Enable: automatic collection is back on
            # every thread, the io thread's too; turn it off again
            self._real_disable()
            self._wanted = True
            self.statistics["reenabled"] += 1
            log.info("automatic garbage collection was turned on from C; off again, collected on the main thread")
        if not self._wanted or self._due() is None:
            return
        self._done.clear()
        if not self._requested.is_set():
            self._requested.set()
            self.statistics["requests"] += 1
            if _add_pending_call(self._callback, None) != 0:
                self._requested.clear()  # the queue is full: asked again at the next poll
                return
        wake = self.wake
        if wake is not None:
            with contextlib.suppress(Exception):  # the user run has ended: the pending call still runs
                wake()
        if not self._done.wait(FALLBACK_DELAY) and self._due() is not None:
            # the main thread is held in C with the GIL released, while other
            # threads allocate: collect here, never on the io thread
            self._collect("fallback")

    def _due(self) -> int | None:
        return due_generation(gc.get_count(), gc.get_threshold(), sys.getallocatedblocks(), self._blocks_at_full)

    # -- the collection -------------------------------------------------------------------
    def _pending_call(self, _arg: Any) -> int:
        """(main thread, from the interpreter's pending calls) Collect if still due."""
        try:
            self._requested.clear()
            if self._wanted:
                self._collect("main")
        except BaseException:  # an interrupt, or a bug: never into the user's frame from here
            log.debug("collection on the main thread failed", exc_info=True)
        return 0

    def _collect(self, where: str) -> None:
        with self._lock:
            generation = self._due()
            if generation is not None:
                gc.collect(generation)
                if generation == 2:
                    self._blocks_at_full = sys.getallocatedblocks()
                self.statistics[where] += 1
        self._done.set()


#: The kernel's collector (None until start-up made it; launch/kernel.py).
COLLECTOR: Collector | None = None


def start(wake: Callable[[], None] | None = None) -> Collector:
    """Make and start the process's collector (once). Runs on: the main thread, at start-up."""
    global COLLECTOR
    if COLLECTOR is None:
        COLLECTOR = Collector(wake)
        COLLECTOR.start()
    return COLLECTOR
