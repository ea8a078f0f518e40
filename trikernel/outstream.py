"""User-side output: sys.stdout / sys.stderr replacements that become IOPub
``stream`` messages, and the Publisher that display, errors and comms use.

Parent routing: the parent header comes from the ``current_parent``
context variable (set for every job; trio tasks started inside a cell
inherit it), else from the latest execute request (threads the cell
started do not inherit context variables). Text goes into the IOPub queue's
coalescing batches (iopub.py); writing never blocks unless the queue is
full (backpressure).
"""

from __future__ import annotations

import codecs
import io
import logging
import os
import signal
import sys
import threading
from contextvars import ContextVar
from typing import Any

from .iopub import IOPubQueue
from .messages import MessageBuilder


class _ForkState:
    """Whether this process is a fork of the kernel (no syscall per write)."""

    forked = False


def _mark_forked() -> None:
    _ForkState.forked = True


os.register_at_fork(after_in_child=_mark_forked)

#: Parent header of the request whose code is running in this context.
current_parent: ContextVar[dict[str, Any] | None] = ContextVar("trikernel_parent", default=None)


class ParentTracker:
    """Holds the fallback parent: the header of the latest execute request."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        p = current_parent.get()
        return p if p is not None else self.latest


class OutStream(io.TextIOBase):
    """A text stream named ``stdout`` or ``stderr`` that publishes on IOPub."""

    def __init__(self, name: str, queue: IOPubQueue, parents: ParentTracker, fallback: Any = None):
        super().__init__()
        self.name_ = name
        self._queue = queue
        self._parents = parents
        self._fallback = fallback  # the kernel's real terminal stream (io-thread writes, fileno)
        self._fd = 1 if name == "stdout" else 2

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"<{self.name_}>"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        """The kernel process's real descriptor (output written to it goes to
        the kernel's terminal, not the notebook), so that faulthandler and
        subprocess(stdout=sys.stdout) work."""
        if self._fallback is None:
            raise io.UnsupportedOperation("no file descriptor")
        return int(self._fallback.fileno())

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if not s:
            return 0
        if _ForkState.forked:
            # A forked child has a copy of the queue that nothing drains. It
            # writes to fd 1/2 instead: with fd capture on, that is the pipe
            # the kernel reads, so the text still reaches the notebook.
            os.write(self._fd, s.encode("utf-8", "replace"))
            return len(s)
        if self._queue.in_io_thread or self._queue.closed:
            # the io thread must never block on its own queue
            if self._fallback is not None:
                self._fallback.write(s)
            return len(s)
        self._queue.write_stream(self.name_, s, self._parents.get())
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Nothing to do: text is queued in order as it is written."""


class Publisher:
    """Sends IOPub messages from user-side code (display, errors, comms),
    parented to the request whose code is running (see ParentTracker)."""

    def __init__(self, builder: MessageBuilder, queue: IOPubQueue, parents: ParentTracker):
        self.builder = builder
        self.queue = queue
        self.parents = parents

    def send(
        self,
        msg_type: str,
        content: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        buffers: tuple[bytes, ...] = (),
    ) -> None:
        """Queue one message (blocks while the IOPub queue is full).

        In a forked child nothing drains this queue: the message is reported
        on the kernel's stderr and dropped instead of blocking the child.
        """
        if _ForkState.forked:
            print(
                f"trikernel: {msg_type} from forked process {os.getpid()} cannot reach the notebook; dropped",
                file=sys.__stderr__,
            )
            return
        msg = self.builder.iopub(msg_type, content, self.parents.get(), metadata=metadata or {}, buffers=buffers)
        self.queue.send_from_thread(msg)


def install(queue: IOPubQueue, parents: ParentTracker, *, capture_fds: bool = True) -> None:
    """Replace sys.stdout/sys.stderr; with ``capture_fds``, also capture
    file descriptors 1 and 2 (subprocesses, ``os.system``, C code, forked
    children) into the same streams, as ipykernel does.

    The kernel's own log and the streams' ``fileno()`` then use saved
    duplicates of the original descriptors (the kernel's terminal).
    """
    real_out, real_err = sys.__stdout__, sys.__stderr__
    if capture_fds:
        real_out = _capture_fd(1)
        real_err = _capture_fd(2)
        for handler in logging.getLogger("trikernel").handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stderr__:
                handler.setStream(real_err)
    sys.stdout = OutStream("stdout", queue, parents, real_out)
    sys.stderr = OutStream("stderr", queue, parents, real_err)
    if capture_fds:
        _start_pump(1, sys.stdout)
        _start_pump(2, sys.stderr)


_PIPES: dict[int, int] = {}  # captured fd -> read end of its pipe


def _capture_fd(fd: int) -> Any:
    """Point ``fd`` at a new pipe; return a text stream on a dup of the old target."""
    saved = os.dup(fd)
    r, w = os.pipe()
    os.dup2(w, fd)
    os.close(w)
    _PIPES[fd] = r
    return os.fdopen(saved, "w", buffering=1, encoding="utf-8", errors="replace")


def _start_pump(fd: int, stream: OutStream) -> None:
    def pump() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # SIGINT is the main thread's
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        r = _PIPES[fd]
        while True:
            try:
                data = os.read(r, 65536)
            except OSError:
                return
            if not data:
                return
            text = decoder.decode(data)
            if text:
                stream.write(text)  # parent: the latest execute request (no context here)

    threading.Thread(target=pump, name=f"trikernel-fd{fd}", daemon=True).start()
