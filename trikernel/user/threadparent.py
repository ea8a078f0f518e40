"""Output of threads goes to the request that started them.

docs/design.md, "Output". Output is parented to ``outstream.current_request``,
a context variable. trio tasks inherit it (a task copies the context it is
spawned from); a ``threading.Thread`` does not: before Python 3.14 a new
thread starts with an empty context, so its output went to the *latest*
execute request, i.e. into whatever cell runs when it prints. This module
makes threads behave as trio tasks do, for this one variable:

- ``Thread.start()`` records the starting context's request on the Thread
  object and the new thread sets it before ``run()``. That covers threads
  started by threads (they start from a context that has it),
  ``threading.Timer`` and every ``Thread`` subclass, whatever its ``run``.
- ``ThreadPoolExecutor.submit()`` records the submitter's request with the
  work item: the pool's workers are started once and reused by later cells,
  so the worker's own start is not enough. ``Executor.map`` submits through
  ``submit``. (``trio.to_thread`` and ``asyncio.to_thread`` copy the caller's
  whole context already.)

Only this variable travels; every other context variable starts empty in a
new thread, as it does in Python 3.11-3.13 and in 3.14's default build. On
3.14 a thread given ``context=`` (or started with
``sys.flags.thread_inherit_context``) runs in that context untouched; one
without gets an empty context holding just the request.

Not covered: ``multiprocessing.pool.ThreadPool`` tasks run with the request
of the cell that created the pool (its workers start there), and fd 1/2
output of any thread carries no parent (fdcapture.py: the latest execute
request).

ipykernel 6.29-7.0 did this with a thread-ident-to-parent map filled from a
patched ``Thread.__init__``/``Thread.run`` (so a subclass overriding ``run``,
such as ``Timer``, was missed); ipykernel 7.1 removed it (PR #1451), and in
7.4.0 thread output goes to the latest request again.

Threads: :func:`install` once, on the main thread, before user code runs.

Runs on: the main thread for :func:`install` (once, before user code);
the patched ``Thread.start`` and ``ThreadPoolExecutor.submit`` run on
any thread that calls them.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from trikernel.user.outstream import current_request

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.protocol.wire import Message

P = ParamSpec("P")
R = TypeVar("R")

_ATTR = "_trikernel_request"
#: Python 3.14+: Thread(context=...) and Thread._context exist.
_THREAD_HAS_CONTEXT = "context" in inspect.signature(threading.Thread.__init__).parameters
_installed = False


class RunAs:
    """A callable that runs ``fn`` with ``request`` as the current request
    (ThreadPoolExecutor work items; any thread may call it)."""

    __slots__ = ("fn", "request")

    def __init__(self, request: Message, fn: Callable[..., Any]):
        self.request = request
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = current_request.set(self.request)
        try:
            return self.fn(*args, **kwargs)
        finally:
            current_request.reset(token)

    def __repr__(self) -> str:
        return repr(self.fn)


def install() -> None:
    """Patch Thread.start (and, before 3.14, Thread._bootstrap_inner) and
    ThreadPoolExecutor.submit. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    orig_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        request = current_request.get()
        if request is not None:
            if _THREAD_HAS_CONTEXT:
                if getattr(self, "_context", None) is None and not getattr(sys.flags, "thread_inherit_context", 0):
                    ctx = contextvars.Context()
                    ctx.run(current_request.set, request)
                    self._context = ctx  # type: ignore[attr-defined]
            else:
                setattr(self, _ATTR, request)
        orig_start(self)

    start.__doc__ = orig_start.__doc__
    threading.Thread.start = start  # type: ignore[method-assign]

    if not _THREAD_HAS_CONTEXT:
        orig_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

        def _bootstrap_inner(self: threading.Thread) -> None:
            # the new thread, before run(): its context is empty here
            request = self.__dict__.get(_ATTR)
            if request is not None:
                current_request.set(request)
            orig_bootstrap_inner(self)

        threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]

    orig_submit = ThreadPoolExecutor.submit

    def submit(self: ThreadPoolExecutor, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        request = current_request.get()
        if request is not None:
            fn = RunAs(request, fn)
        return orig_submit(self, fn, *args, **kwargs)

    submit.__doc__ = orig_submit.__doc__
    ThreadPoolExecutor.submit = submit  # type: ignore[method-assign, assignment]
