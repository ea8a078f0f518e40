"""Python's thread switch interval, shortened while a control request is
being received and answered.

Runs on: the io run (one thread); nothing here is thread-safe, nor needs to
be: only the io run calls it.

While a cell computes or prints, it holds the GIL, and the io thread, woken
for a control request (``kernel_info``, ``interrupt``, ``shutdown``, the
debugger's), waits for it up to the switch interval each time it takes it
back: after its ``epoll`` and after every libzmq call, which pyzmq makes
without the GIL (one per frame: about fifteen to receive a request and send
its reply). At the 1 ms ``--switch-interval``, ``kernel_info`` on control
during a print flood took 1.6-10 ms (docs/benchmarks.md, "Round 4").

A shorter interval all the time costs elsewhere: on this 2-core VM,
``execute_request`` of ``pass`` answered 8-17 % later at 0.2 ms (the io and
main threads trade the GIL more often around the hand-over), and while a
cell ran longer than 5 ms, a print flood's stream throughput fell 7-21 %.
So the io run shortens it (``--control-switch-interval``) only from the
moment the control socket wakes it (:meth:`SwitchIntervals.shorten`,
called by the control socket's ``on_wake``) until the request has been
routed and its reply sent (:meth:`SwitchIntervals.restore`).

Code that sets the interval itself is respected: it is shortened only if it
is longer than the short one, and put back only if it is still the short
one.
"""

from __future__ import annotations

import sys


class SwitchIntervals:
    """``short``: the switch interval (s, > 0) while a control request is
    received and answered; Python's own interval (set at start-up from
    ``--switch-interval``) applies otherwise."""

    def __init__(self, short: float):
        self.short = short
        self._restore: float | None = None  # the interval to put back, while shortened

    def shorten(self) -> None:
        """Set the short interval (idempotent) unless it is shorter already."""
        if self._restore is not None:
            return
        current = sys.getswitchinterval()
        if current > self.short:
            self._restore = current
            sys.setswitchinterval(self.short)

    def restore(self) -> None:
        """Put back the interval :meth:`shorten` replaced, unless someone
        changed it meanwhile (idempotent)."""
        if self._restore is None:
            return
        # getswitchinterval keeps microseconds: compare as such
        if round(sys.getswitchinterval() * 1e6) == round(self.short * 1e6):
            sys.setswitchinterval(self._restore)
        self._restore = None

    @property
    def shortened(self) -> bool:
        """The short interval is in place (set by :meth:`shorten`)."""
        return self._restore is not None
