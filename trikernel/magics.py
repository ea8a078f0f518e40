"""The ``%trikernel`` line magic: IOPub counters and kernel facts.

``%trikernel`` prints the IOPub statistics (iopub.IOPubStats): messages
sent, waits on full subscribers, fallback drops, coalescing ratio — and
``malformed_dropped``: bad input from peers dropped or refused since
start-up (badinput.py), with ``malformed_by_kind`` per channel and kind.
"""

from __future__ import annotations

from typing import Any


def register(shell: Any, kernel: Any) -> None:
    def trikernel_magic(line: str = "") -> dict[str, Any]:
        stats = kernel.stats.as_dict()
        stats["iopub_capacity"] = kernel.iopub_queue.capacity
        stats["iopub_queued"] = len(kernel.iopub_queue)
        stats["degraded"] = bool(kernel.publisher is not None and kernel.publisher.degraded)
        bad = kernel.bad_input.statistics()
        stats["malformed_dropped"] = bad.dropped
        stats["malformed_by_kind"] = bad.by_kind
        for k, v in stats.items():
            print(f"{k:>18}: {v}")
        return stats if line.strip() == "--return" else None  # type: ignore[return-value]

    shell.register_magic_function(trikernel_magic, "line", "trikernel")
