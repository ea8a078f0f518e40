"""User-side output: sys.stdout / sys.stderr replacements that become IOPub
``stream`` messages, and the Publisher that display, errors and comms use.

Order with fd 1/2: before any of this is queued, fd output written before
it is published first (``fdcapture.before_output``), so
``print('a'); os.system('echo b'); print('c')`` reads a, b, c.

Parent routing: the parent header is that of ``current_request``, the
context variable set for every request's code (trio tasks a cell starts
inherit it; threads and executor work too, threadparent.py), else that of
the latest execute request. Text goes into the IOPub queue's
coalescing batches (server/iopubqueue.py); writing never blocks unless the queue is
full (backpressure).

Runs on: any thread but the io thread (``OutStream.write``,
``Publisher.send``; the fd reader: ``OutStream.publish``); every user run
(``ParentTracker.running``); the main thread (:func:`install`).
"""

from __future__ import annotations

import io
import logging
import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trikernel.user import fdcapture

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trikernel.core.interfaces import IOPubSink
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Message


class _ForkState:
    """Whether this process is a fork of the kernel (no syscall per write)."""

    forked = False


def _mark_forked() -> None:
    _ForkState.forked = True


os.register_at_fork(after_in_child=_mark_forked)

#: Characters a forked child holds back waiting for the end of a line.
CHILD_LINE_MAX = 4096

#: The request whose code runs in this context: the execute_request in a
#: cell, the comm_msg in a widget callback. trio tasks inherit it (a task
#: copies the context it was spawned from), and so do threads and
#: ThreadPoolExecutor work (threadparent.py).
current_request: ContextVar[Message | None] = ContextVar("trikernel_request", default=None)

#: IOPub output a ``silent`` execute request does not broadcast (comm
#: messages and status still go out: they are not output).
OUTPUT_TYPES = frozenset({"display_data", "update_display_data", "execute_result", "error", "clear_output"})
log = logging.getLogger("trikernel.outstream")


class ParentTracker:
    """Which request output belongs to (any thread may read it).

    The running request (``current_request``), else the fallback: the
    latest execute request, for code that runs outside any request (a
    thread started by a library at import, fd output).
    """

    def __init__(self) -> None:
        self.latest_request: Message | None = None
        #: the latest request read on control (``get_ipython().kernel.get_parent("control")``)
        self.latest_control: Message | None = None

    @staticmethod
    def set_current(msg: Message) -> Token[Message | None]:
        """Make ``msg`` the request of this context (thread, trio task) from now
        on: ipykernel's ``set_parent``. Returns the token :meth:`reset_current`
        takes. Any thread."""
        return current_request.set(msg)

    @staticmethod
    def reset_current(token: Token[Message | None]) -> None:
        """Undo the :meth:`set_current` that returned ``token`` (same context)."""
        current_request.reset(token)

    def control_seen(self, msg: Message) -> None:
        """The core read ``msg`` on control (io run; one attribute store)."""
        self.latest_control = msg

    @property
    def latest(self) -> dict[str, Any]:
        """Header of the latest execute request (``{}`` before the first)."""
        r = self.latest_request
        return r.header if r is not None else {}

    def request(self) -> Message | None:
        """The request of this context, else the latest execute request."""
        r = current_request.get()
        return r if r is not None else self.latest_request

    def get(self) -> dict[str, Any]:
        """Parent header for output produced now, in this context."""
        r = current_request.get()
        if r is None:
            r = self.latest_request
        return r.header if r is not None else {}

    @staticmethod
    def silent() -> bool:
        """True while the code of an ``execute_request`` with ``silent: true``
        runs in this context: its output is not broadcast (messaging spec
        "Execute": silent "will not broadcast output on the IOPUB channel")."""
        r = current_request.get()
        return r is not None and r.content.get("silent") is True and r.msg_type == "execute_request"

    @contextmanager
    def running(self, msg: Message, *, execute: bool = False) -> Iterator[None]:
        """Run a request's code inside: its output is parented to ``msg``
        (``execute``: it also becomes the latest execute request). On the
        way out, fd 1/2 output written meanwhile is published (fdcapture),
        so it is on IOPub before the request's reply and idle.

        Main thread, in the user run (one job or comm task per request).
        """
        token = current_request.set(msg)
        if execute and msg.content.get("silent") is not True:
            # a silent request is invisible: it never becomes the cell that
            # context-less output (fd 1/2, library threads) is shown in
            self.latest_request = msg
        try:
            yield
        finally:
            try:
                fdcapture.flush()
            finally:
                current_request.reset(token)


class OutStream(io.TextIOBase):
    """A text stream named ``stdout`` or ``stderr`` that publishes on IOPub."""

    def __init__(self, name: str, queue: IOPubSink, parents: ParentTracker, fallback: Any = None):
        super().__init__()
        self.name_ = name
        self._queue = queue
        self._parents = parents
        self._fallback = fallback  # the kernel's real terminal stream (io-thread writes, fileno)
        self._fd = 1 if name == "stdout" else 2
        self._child_pending = ""  # a forked child's unfinished line
        self._before_output = fdcapture.order_hook()  # fd output written before a write goes first
        self._master_pid = os.getpid()

    @property
    def name(self) -> str:
        """The stream's file-like name, ``"<stdout>"`` or ``"<stderr>"`` (as ipykernel's
        OutStream gives it); the IOPub ``stream`` name is ``name_``."""
        return f"<{self.name_}>"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """Always ``"UTF-8"``: the text goes into JSON ``stream`` messages (messaging spec
        "Streams (stdout, stderr, etc)"). Spelled as ipykernel's ``OutStream.encoding``
        (iostream.py), for code that compares the string."""
        return "UTF-8"

    def _is_master_process(self) -> bool:
        """ipykernel's ``OutStream._is_master_process``: False in a forked child
        (ipykernel's own tests, and code written against them, call it)."""
        return os.getpid() == self._master_pid

    def writable(self) -> bool:
        """``io.TextIOBase.writable``: always True."""
        return True

    def isatty(self) -> bool:
        """``io.TextIOBase.isatty``: always False (the notebook is no terminal), so libraries
        write no terminal control sequences."""
        return False

    def fileno(self) -> int:
        """The kernel process's real descriptor (output written to it goes to
        the kernel's terminal, not the notebook), so that faulthandler and
        subprocess(stdout=sys.stdout) work."""
        if self._fallback is None:
            raise io.UnsupportedOperation("no file descriptor")
        return int(self._fallback.fileno())

    def write(self, s: str) -> int:
        """``io.TextIOBase.write``: append ``s`` to this stream's IOPub ``stream`` batch,
        parented to the request running in this context (else the latest execute request);
        returns ``len(s)``. Dropped and counted (``silenced``) during a silent execute
        request; on the io thread or once the queue is closed, written to the kernel's
        terminal instead; in a forked child, whole lines go to fd 1/2. Any thread; blocks only
        while the IOPub queue is full. Raises TypeError for a non-str."""
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if not s:
            return 0
        if _ForkState.forked:
            # A forked child has a copy of the queue that nothing drains. It
            # writes to fd 1/2 instead: with fd capture on, that is the pipe
            # the kernel reads, so the text still reaches the notebook. Whole
            # lines at once (print is two writes), so that lines of several
            # processes writing together are not torn.
            self._child_pending += s
            end = self._child_pending.rfind("\n") + 1
            if end or len(self._child_pending) >= CHILD_LINE_MAX:
                end = end or len(self._child_pending)
                self._write_fd(self._child_pending[:end])
                self._child_pending = self._child_pending[end:]
            return len(s)
        if self._queue.in_io_thread or self._queue.closed:
            # the io thread must never block on its own queue
            if self._fallback is not None:
                self._fallback.write(s)
            return len(s)
        if self._parents.silent():
            self._queue.stats.silenced += 1
            return len(s)
        self._before_output()
        self._queue.write_stream(self.name_, s, self._parents.get())
        return len(s)

    def publish(self, text: str, parent: dict[str, Any]) -> None:
        """Queue ``text`` with an explicit ``parent`` header (fd capture's reader;
        any thread but the io thread; blocks while the IOPub queue is full)."""
        if self._queue.closed or self._queue.in_io_thread:
            if self._fallback is not None:
                self._fallback.write(text)
            return
        self._queue.write_stream(self.name_, text, parent)

    def writelines(self, lines: Any) -> None:
        """``io.IOBase.writelines``: :meth:`write` each item of ``lines`` in turn (no newlines
        added). Any thread."""
        for line in lines:
            self.write(line)

    def _write_fd(self, text: str) -> None:
        data = memoryview(text.encode("utf-8", "replace"))
        while data:
            data = data[os.write(self._fd, data) :]

    def flush(self) -> None:
        """Text is queued in order as it is written; flush() lets an unfinished line leave
        now instead of after the rest of the line or PARTIAL_LINE_HOLD (docs/iopub.md,
        "Stream coalescing"). A forked child writes out its unfinished line."""
        if _ForkState.forked and self._child_pending:
            pending, self._child_pending = self._child_pending, ""
            self._write_fd(pending)
            return
        if not (self._queue.in_io_thread or self._queue.closed):
            self._queue.flush_stream(self.name_)


@dataclass(frozen=True)
class Publisher:
    """Sends IOPub messages from user-side code (display, errors, comms),
    parented to the request whose code is running (see ParentTracker)."""

    builder: MessageBuilder
    queue: IOPubSink
    parents: ParentTracker

    def send(
        self,
        msg_type: str,
        content: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        buffers: tuple[bytes, ...] = (),
    ) -> None:
        """Queue one message parented to the request of this context (blocks
        while the IOPub queue is full; see :meth:`send_message`)."""
        if self._dropped(msg_type):
            return
        fdcapture.before_output()  # fd output written before this message goes first
        msg = self.builder.iopub(msg_type, content, self.parents.get(), metadata=metadata or {}, buffers=buffers)
        self.queue.put_from_thread(msg)

    def send_message(self, msg: Message) -> bool:
        """Queue ``msg``, an IOPub message built by the caller (its own header
        and parent: ``get_ipython().kernel.session.send``). Blocks while the
        IOPub queue is full. Returns False when it was dropped: in a forked
        child nothing drains this queue (the message is reported on the
        kernel's stderr instead of blocking the child); output of a silent
        request is not broadcast (counted). Any thread but the io thread."""
        if self._dropped(msg.msg_type):
            return False
        fdcapture.before_output()
        return self.queue.put_from_thread(msg)

    def _dropped(self, msg_type: str) -> bool:
        if _ForkState.forked:
            # the kernel's log: its handler writes to the saved real stderr
            # (the terminal); sys.__stderr__ is fd 2, captured into the notebook
            log.warning("%s from forked process %d cannot reach the notebook; dropped", msg_type, os.getpid())
            return True
        if msg_type in OUTPUT_TYPES and self.parents.silent():
            self.queue.stats.silenced += 1
            return True
        return False


def install(
    queue: IOPubSink, parents: ParentTracker, *, capture_fds: bool = True, fd_backlog: int = fdcapture.DEFAULT_BACKLOG
) -> None:
    """Replace sys.stdout/sys.stderr; with ``capture_fds``, also capture
    file descriptors 1 and 2 (subprocesses, ``os.system``, C code, forked
    children) into the same streams (fdcapture.py; ``fd_backlog``: bytes per
    fd held for the notebook before output is dropped, counted and shown).

    The kernel's own log and the streams' ``fileno()`` then use saved
    duplicates of the original descriptors (the kernel's terminal).
    """
    real_out: Any = sys.__stdout__
    real_err: Any = sys.__stderr__
    streams: dict[str, OutStream] = {}
    if capture_fds:

        def write_fd_text(name: str, text: str) -> None:
            # a pipe carries no parent: fd text goes to the latest execute request
            streams[name].publish(text, parents.latest)

        saved_out, saved_err = fdcapture.install(write_fd_text, backlog=fd_backlog)
        real_out = os.fdopen(saved_out, "w", buffering=1, encoding="utf-8", errors="replace")
        real_err = os.fdopen(saved_err, "w", buffering=1, encoding="utf-8", errors="replace")
        for handler in logging.getLogger("trikernel").handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stderr__:
                handler.setStream(real_err)
    streams["stdout"] = OutStream("stdout", queue, parents, real_out)
    streams["stderr"] = OutStream("stderr", queue, parents, real_err)
    sys.stdout, sys.stderr = streams["stdout"], streams["stderr"]
    if capture_fds:
        fdcapture.start(real_err.fileno())
