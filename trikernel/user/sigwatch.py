"""A SIGINT whose Python handler cannot run yet, and the watch that makes it run.

Runs on: :meth:`SigintWatch.start`, :meth:`~SigintWatch.close` and
:meth:`~SigintWatch.handler_ran` on the main thread (inside the user run, the
last from the SIGINT handler); the watch itself on its own thread,
"trikernel-sigint", SIGINT blocked. docs/design.md, "Threads and loops".

CPython runs a signal's Python handler at the main thread's next check for
pending signals: between bytecodes, or when a blocking call returns EINTR. A
SIGINT that arrives after the last such check and before the main thread
enters a blocking system call (``time.sleep``'s ``clock_nanosleep``, a lock
wait, ``select``) interrupts nothing: its C-level handler has already run, so
the call sleeps on and KeyboardInterrupt is raised only when it returns. The
window is widest when the main thread waits for the GIL in between (CPython
looks for signals before it hands the GIL over, not after it gets it back).
Measured with a cell ``print('STARTED', flush=True); time.sleep(60)``
interrupted as soon as STARTED arrived: 3 of 1,000 interrupts answered 60 s
late in the plain run, 1-2 of 1,000 with Qt hosting the run, in both
interrupt modes; ipykernel 7.4.0 1 in 1,000 (strace of a late one: the
SIGINT reached the main thread 0.13 ms before its ``clock_nanosleep`` began,
which then ran its 60 s).

The one trace such a signal leaves is the byte its C-level handler writes to
the wakeup fd (``signal.set_wakeup_fd``). The watch takes the wakeup fd (a
pipe of its own; every signal byte is passed on to trio's, whose run needs it
to wake) and the kernel's SIGINT handler writes :data:`MARK` into the same
pipe each time it runs, so the pipe orders SIGINTs and handler runs. A SIGINT
with no mark after it :data:`NUDGE_DELAY` later, while a job runs, is stuck:
the watch sends the main thread :data:`NUDGE_SIGNAL`, whose Python handler
does nothing. The blocking call returns EINTR, and CPython runs the pending
handlers before it retries the call (PEP 475): the SIGINT's among them. The
nudge is sent again, the wait doubling, at most :data:`NUDGE_TRIES` times
while that SIGINT stays unhandled. A SIGINT that was handled is never
nudged, so a cell that caught its KeyboardInterrupt and sleeps on is left
alone; a SIGINT handler of the user's own (it writes no mark) costs at most
:data:`NUDGE_TRIES` EINTRs, each retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from trikernel.threads import not_traced
from trikernel.user import guestrun

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.sigwatch")

#: Written by the kernel's SIGINT handler each time it runs (no signal has this number).
MARK = 0xFF
#: Seconds a SIGINT may stay unhandled while a job runs before the main thread
#: is nudged (a handled one is marked within microseconds; a loaded machine
#: may take milliseconds to schedule the main thread, and a nudge then costs
#: one retried system call).
NUDGE_DELAY = 0.05
#: Nudges at most per unhandled SIGINT (waits of 0.05, 0.1, 0.2, 0.4, 0.8 s).
NUDGE_TRIES = 5
#: What nudges the main thread: ignored by default (a nudge can never end the
#: process, whatever its disposition), used by nothing a kernel runs.
NUDGE_SIGNAL = signal.SIGURG


def _nudged(signum: int, frame: Any) -> None:
    """NUDGE_SIGNAL's handler: nothing. Being a Python handler is what makes a
    blocking call return EINTR and CPython run the pending handlers."""


class SigintWatch:
    """Owns the wakeup fd of the main thread's user run while it runs (module docstring).

    Args:
        interruptible: whether a job runs now (any thread may call it).

    Runs on: the main thread (:meth:`start`, :meth:`close`, :meth:`handler_ran`);
    its reader on the "trikernel-sigint" thread.
    """

    def __init__(self, interruptible: Callable[[], bool], trio_fd: int, read_fd: int, write_fd: int):
        self._interruptible = interruptible
        self._trio_fd = trio_fd  # trio's wakeup socket (-1: none), every signal byte goes on to it
        self._read_fd, self._write_fd = read_fd, write_fd
        self._main = threading.main_thread().ident
        self._nudge = signal.getsignal(NUDGE_SIGNAL) is _nudged
        self.nudges = 0  #: nudges sent (for tests and %trikernel-style statistics)
        self._thread = not_traced(threading.Thread(target=self._watch, name="trikernel-sigint", daemon=True))

    @classmethod
    def start(cls, interruptible: Callable[[], bool]) -> SigintWatch | None:
        """Take the wakeup fd and start the watch. Main thread, inside the user run
        (trio has set its wakeup fd). Returns None where it cannot (not the main
        thread): interrupts then work as before, without the nudge."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement; the handler's mark never blocks
        try:
            trio_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        if signal.getsignal(NUDGE_SIGNAL) in (signal.SIG_DFL, None):
            signal.signal(NUDGE_SIGNAL, _nudged)
        else:  # someone's own: never call it for our purposes
            log.info("%s has a handler already: a SIGINT stuck before a blocking call is not nudged", NUDGE_SIGNAL)
        watch = cls(interruptible, trio_fd, read_fd, write_fd)
        with guestrun.sigint_blocked():  # a process-directed SIGINT must not pick this thread
            watch._thread.start()
        return watch

    def handler_ran(self) -> None:
        """Mark a run of the kernel's SIGINT handler (main thread, from the handler;
        never blocks, never raises)."""
        fd = self._write_fd
        if fd < 0:
            return  # closed: the run is ending
        with contextlib.suppress(OSError):  # full: the watch is far behind
            os.write(fd, bytes((MARK,)))

    def close(self) -> None:
        """Give the wakeup fd back to trio and end the watch. Main thread, inside the
        user run, before it ends (trio closes its wakeup socket then)."""
        mine = signal.set_wakeup_fd(self._trio_fd, warn_on_full_buffer=False)
        if mine != self._write_fd:  # user code took it meanwhile: leave theirs
            signal.set_wakeup_fd(mine, warn_on_full_buffer=False)
        if signal.getsignal(NUDGE_SIGNAL) is _nudged:
            signal.signal(NUDGE_SIGNAL, signal.SIG_DFL)
        fd, self._write_fd = self._write_fd, -1  # the handler writes no more marks
        os.close(fd)  # the watch reads EOF and ends
        self._thread.join(1.0)

    # -- the "trikernel-sigint" thread -------------------------------------------
    def _watch(self) -> None:
        try:
            self._loop()
        finally:
            os.close(self._read_fd)

    def _loop(self) -> None:
        pending: float | None = None  # when the oldest SIGINT not yet marked handled was read
        tries = 0
        next_nudge = 0.0
        while True:
            timeout = None if pending is None else max(0.0, next_nudge - time.monotonic())
            if select.select([self._read_fd], [], [], timeout)[0]:
                data = os.read(self._read_fd, 4096)
                if not data:
                    return  # closed
                signals = bytes(b for b in data if b != MARK)
                if signals:
                    self._forward()
                for b in data:
                    if b == MARK:
                        pending, tries = None, 0
                    elif b == signal.SIGINT and pending is None:
                        pending, next_nudge = time.monotonic(), time.monotonic() + NUDGE_DELAY
                continue
            # a SIGINT has waited for its handler past next_nudge
            if tries >= NUDGE_TRIES:
                log.info("a SIGINT stayed unhandled after %d nudges (a handler of the user's own?)", tries)
                pending, tries = None, 0
                continue
            if self._interruptible() and self._nudge and signal.getsignal(NUDGE_SIGNAL) is _nudged:
                assert self._main is not None
                log.info("SIGINT unhandled for %.0f ms while a job runs: nudging the main thread", 1000 * NUDGE_DELAY)
                signal.pthread_kill(self._main, NUDGE_SIGNAL)
                self.nudges += 1
            tries += 1
            next_nudge = time.monotonic() + NUDGE_DELAY * 2**tries

    def _forward(self) -> None:
        """Wake trio's run as the signal itself would have (its wakeup socket's
        content is not read; a full buffer already holds a wake-up)."""
        if self._trio_fd < 0:
            return
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending; closed: the run ended
            os.write(self._trio_fd, b"\x00")
