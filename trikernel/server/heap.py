"""Give memory freed after large dropped input back to the operating system.

A peer can send messages of many MiB that the kernel drops (too deep, a bad
signature, too large). Their frames are freed at once, but glibc keeps the
freed heap: its mmap threshold grows after large frees (up to 32 MiB), so
later large buffers come from the heap and their pages stay resident. The
process's RSS then stays up to a few hundred MiB above its baseline after a
fuzzer's burst, with nothing alive (measured: +130 MiB after 6,000 deeply
nested frames, back to +15 MiB after ``malloc_trim``; docs/robustness.md).

:class:`HeapTrimmer` counts the bytes of dropped input and calls glibc's
``malloc_trim(0)`` once enough has been dropped, at most once per
``min_interval``. Elsewhere (musl, macOS) it does nothing.

What it cannot return: the top of a thread's arena. ``malloc_trim`` gives
back free pages inside every arena but shrinks only the main arena's top;
a thread arena's top shrinks on ``free`` once it is over glibc's trim
threshold, which grows to twice the largest freed mmapped block (up to
64 MiB). So what the io thread allocated at its busiest stays resident
(13 MiB after 100,000-deep frames, when the depth pre-scan made an
object per string literal; issue 26, docs/robustness.md "Memory of
dropped input"): the io thread's work on dropped input keeps its
transient memory near the frame's size instead (wire.py
``_check_depth``).

Runs on: the io run (the channel tasks call it); ``malloc_trim`` takes the
allocator's locks for a few milliseconds.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.heap")

#: Bytes of dropped input after which free heap is returned at once (16 MiB).
TRIM_AFTER_BYTES = 16 << 20
#: Seconds between two trims at most; also how soon after a burst ends the
#: rest of it is returned (run()).
MIN_INTERVAL = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the symbols the process already has
    (``dlopen(NULL)``), or None where there is none (musl, macOS).

    Not ``ctypes.util.find_library("c")``: on Linux that runs ``ldconfig -p``
    (and may run ``gcc``) as a child of the kernel, on every start-up.
    """
    try:
        libc = ctypes.CDLL(None)
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


@dataclass(frozen=True)
class HeapStatistics:
    """What :meth:`HeapTrimmer.statistics` returns."""

    #: times ``malloc_trim`` ran
    trims: int
    #: input was dropped since :meth:`HeapTrimmer.run` last trimmed: the trim
    #: that returns the rest of a burst is still to come (within two
    #: ``min_interval``); False once it ran, and always where nothing is trimmed
    trim_due: bool


class HeapTrimmer:
    """Returns free heap to the OS after ``after_bytes`` of dropped input."""

    def __init__(self, after_bytes: int = TRIM_AFTER_BYTES, min_interval: float = MIN_INTERVAL):
        self.after_bytes = after_bytes
        self.min_interval = min_interval
        self.trims = 0  #: times malloc_trim ran
        self._pending = 0
        self._owed = False  # input was dropped since the last trim by run()
        self._last = -min_interval
        self._trim = _malloc_trim()

    def statistics(self) -> HeapStatistics:
        """The trims so far and whether one is due (any thread: plain reads)."""
        return HeapStatistics(self.trims, self._owed)

    def dropped(self, nbytes: int) -> None:
        """Count ``nbytes`` of input that was dropped and freed; trim when due."""
        if self._trim is None:
            return
        self._pending += nbytes
        self._owed = True
        if self._pending < self.after_bytes:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval:
            return
        self._do_trim(now)

    def _do_trim(self, now: float) -> None:
        assert self._trim is not None
        self._pending = 0
        self._last = now
        self._trim(0)
        self.trims += 1
        log.debug("returned free heap to the OS after large dropped input (%d trims)", self.trims)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """io run task: once a burst of dropped input is over, return the rest
        of it too, within two ``min_interval`` of the last drop (at most one
        trim per interval, this one or :meth:`dropped`'s). A timer
        (principle 3): no event says "the peer stopped".

        A trim that :meth:`dropped` takes runs while the message that made it
        due is still referenced, and whatever the burst frees after it stays
        resident unless one more trim follows: so this trims after every
        interval in which anything was dropped, not only when bytes are still
        pending.
        """
        task_status.started()
        if self._trim is None:
            return
        while True:
            await trio.sleep(self.min_interval)
            now = time.monotonic()
            if self._owed and now - self._last >= self.min_interval:  # at most one trim per interval
                self._owed = False
                self._do_trim(now)
