"""``trikernel-conformance KERNELSPEC``: a protocol conformance suite for any Jupyter kernel.

Starts the named kernelspec with jupyter_client, runs a catalogue of checks
(the wire envelope of every message, busy/idle and ordering, execution and
its counter, errors and stop_on_error, the other shell requests, comms,
stdin, interrupts, IOPub welcome and delivery, bad input, the heartbeat,
shutdown and restart, start-up) and prints one row per check: PASS / FAIL /
SKIP, the figure that decided it and the spec section it follows. See
docs/conformance.md.

Modules: ``cli`` (arguments, table, JSON), ``runner`` (order, recovery),
``catalogue`` (registry, context), ``kernel`` (the kernel under test),
``client`` (raw sockets), ``audit`` (every-message checks), ``snippets``
(code per language), ``checks_*`` (the checks), ``verdict``. Message
validation itself is :mod:`trikernel.msgspec`.

Runs on: the client's process, on the caller's thread only (blocking
pyzmq and jupyter_client; the suite starts no threads of its own).
"""

from __future__ import annotations

from trikernel.conformance.runner import Report, Row, UsageError, run

__all__ = ["Report", "Row", "UsageError", "run"]
