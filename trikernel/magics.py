"""The ``%trikernel`` line magic: IOPub counters and kernel facts.

Runs on: the main thread, in a cell. ``%trikernel`` prints the IOPub
statistics (iopub.IOPubStats and the queue's state: messages sent, waits on
full subscribers, fallback drops, coalescing, messages dropped at shutdown)
and ``malformed_dropped``: bad input from peers dropped or refused since
start-up (badinput.py), with ``malformed_by_kind`` per channel and kind;
``%trikernel --return`` also returns them as a dict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def register(shell: Any, stats: Callable[[], dict[str, Any]]) -> None:
    """Register ``%trikernel`` on ``shell``; ``stats()`` returns the counters
    (thread-safe reads of plain ints)."""

    def trikernel_magic(line: str = "") -> dict[str, Any] | None:
        values = stats()
        for k, v in values.items():
            print(f"{k:>18}: {v}")
        return values if line.strip() == "--return" else None

    shell.register_magic_function(trikernel_magic, "line", "trikernel")
