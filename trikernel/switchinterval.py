"""Python's thread switch interval, shortened while a request runs long.

Runs on: the io run (one thread); nothing here is thread-safe, nor needs to
be: only the io run enters and leaves.

While a cell computes or prints, it holds the GIL, and the io thread, woken
for a control request (``kernel_info``, ``interrupt``, the debugger) or a
subshell's, waits for it up to the switch interval each time it takes it
back: after its ``epoll`` and after every libzmq call, which pyzmq makes
without the GIL (a request is received and answered in about ten such
calls). At the 1 ms ``--switch-interval``, ``kernel_info`` on control during
a print flood took 3-8 ms (docs/benchmarks.md, "Round 4"). A shorter
interval all the time costs the short requests: on this 2-core VM,
``execute_request`` of ``pass`` answered 8-17 % later at 0.2 ms, because
the io and main threads then trade the GIL more often around the
hand-over. So the interval is shortened only once a sequential request has
run :data:`LONG_REQUEST` seconds (``--busy-switch-interval``) and put back
when no such request runs.

Code that sets the interval itself is respected: the interval is shortened
only if it is longer than the busy one when a long request begins, and put
back only if it is still the busy one when the last long request ends.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Seconds a sequential request runs before the busy interval applies: a
#: plain cell (about 1 ms) never reaches it.
LONG_REQUEST = 0.005


class SwitchIntervals:
    """``busy``: the switch interval (s, > 0) while at least one long
    request runs (:meth:`long_request`). Python's own interval (set at
    start-up from ``--switch-interval``) applies otherwise."""

    def __init__(self, busy: float):
        self.busy = busy
        self._long = 0  # long requests running now
        self._restore: float | None = None  # the interval to put back, if this set it

    @contextlib.contextmanager
    def long_request(self) -> Iterator[None]:
        """Hold the busy interval while the body runs (io run; nests, and
        overlaps across shell lanes: the main shell and subshells)."""
        self._long += 1
        if self._long == 1:
            current = sys.getswitchinterval()
            if current > self.busy:
                self._restore = current
                sys.setswitchinterval(self.busy)
        try:
            yield
        finally:
            self._long -= 1
            if self._long == 0 and self._restore is not None:
                # getswitchinterval rounds to microseconds: compare as such
                if round(sys.getswitchinterval() * 1e6) == round(self.busy * 1e6):
                    sys.setswitchinterval(self._restore)
                self._restore = None

    @property
    def active(self) -> bool:
        """A long request holds the busy interval now."""
        return self._long > 0
