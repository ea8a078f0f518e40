"""The kernel's threads: their names, and the mark that keeps the debugger off them.

Every thread the kernel starts is named ``trikernel-<what>`` (docs/design.md,
"Threads and loops") and marked with :func:`not_traced` where it is
created, so that debugpy never traces or suspends it: a breakpoint stops
every traced thread, and an unmarked io thread would deadlock the kernel at
the first stop. This module is the one place of that tag; the debugger
(debug/) and every module that starts a thread import it from here.

Runs on: any thread. Pure: no trio, no IPython, no debugpy.
"""

from __future__ import annotations

import threading
from typing import TypeVar

#: Prefix of the name of every thread the kernel starts itself.
PREFIX = "trikernel-"

_T = TypeVar("_T", bound=threading.Thread)


def not_traced(thread: _T) -> _T:
    """Mark a kernel thread so debugpy never traces or suspends it
    (``pydev_do_not_trace``, ``is_pydev_daemon_thread``; pydevd reads both).

    Args:
        thread: a ``threading.Thread``, before it runs or at least before
            debugpy starts.

    Returns:
        ``thread`` itself, so a creation can be wrapped:
        ``not_traced(threading.Thread(...)).start()``.

    Runs on: any thread.
    """
    thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
    thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]
    return thread


def is_kernel_thread(thread: threading.Thread) -> bool:
    """Whether ``thread`` is the kernel's: named ``trikernel-*``, one of trio's
    worker threads (``Trio thread N``), or IPython's ``HistorySavingThread``.

    Runs on: any thread.
    """
    return thread.name.startswith((PREFIX, "Trio thread")) or type(thread).__name__ == "HistorySavingThread"


def mark_kernel_threads() -> list[str]:
    """Mark every kernel thread running now (:func:`is_kernel_thread`) with
    :func:`not_traced`, also those started where no mark was set (trio's
    cached workers).

    Returns:
        The names of the threads marked.

    Runs on: any thread; called just before ``debugpy.listen``.
    """
    marked = []
    for t in threading.enumerate():
        if t is not threading.main_thread() and is_kernel_thread(t):
            not_traced(t)
            marked.append(t.name)
    return marked
