"""Capture of file descriptors 1 and 2 (C code, subprocesses, ``os.system``).

docs/design.md, "Output". fd 1 and fd 2 of the kernel process point at
pipes, as in ipykernel, so a subprocess or a forked child sees exactly what
it would see under ipykernel (a pipe: ``> /dev/stderr`` and
``open("/dev/stdout", "w")`` work; a regular file there would be truncated
by them). What differs is who drains the pipes:

- **the relay** (``_fdrelay.py``), a small helper process with its own GIL,
  reads both pipes all the time and appends what it reads to one memfd per
  fd. So a writer never blocks on the kernel: C code that holds the GIL
  can write 10 MB to fd 1 (a pipe drained by a kernel thread holds 64 KiB,
  then that writer and the drain thread wait for each other for good).
- **the reader thread** ("trikernel-fd") wakes on the relay's doorbell
  pipe, reads each memfd at its own offset (``pread``), decodes UTF-8
  incrementally and writes the text into the notebook's ``stdout`` /
  ``stderr`` stream, then frees the consumed range
  (``fallocate(PUNCH_HOLE)``), so memory holds only the backlog.
- **flush** (:func:`flush`): on the path before a request's reply, the
  main thread makes sure everything written so far is in the memfds —
  already true when both pipes are empty and the relay is not between a
  read and its append (its busy byte); else it asks the relay to empty
  both pipes (a control byte; the relay answers when everything written
  before the question is in the memfds) — and then reads the memfds to
  their end itself. So fd output written
  while a cell runs is on IOPub before that cell's reply and idle — exactly,
  with no sleep.
- **order** (:func:`before_output`): before Python-level output is queued
  (``sys.stdout``/``sys.stderr`` writes, display, errors, comm messages;
  outstream.py), the fd bytes written before it go first: the same collect
  as the flush, when anything is in flight. Telling that nothing is costs
  one syscall (``epoll_wait`` of both pipes with no timeout) and two reads
  of the relay's state page: its busy and gap bytes, and the bytes it has
  appended to each memfd, compared with what the kernel has published. So
  ``print('a'); os.system('echo b'); print('c')`` shows a, b, c, always.
  Output a writer produces *while* Python prints (a subprocess still
  running) has no "before": it goes in at the next write that finds it.

Bound: the relay keeps the backlog (appended, not yet consumed) at most
``--fd-backlog-bytes`` per fd (64 MiB by default). Past it, it keeps reading
the pipe (the writer still never blocks), drops what it reads and counts
it; when the kernel has caught up, the stream gets one line saying how many
bytes were dropped there. Counts: :func:`statistics`, ``%trikernel``.

Parent: a pipe carries no parent header, so fd text goes to the *latest*
execute request, whoever reads it. With the flush, everything written while
a cell runs is that cell's; only what is written after its reply (a
background thread or subprocess) can land in a later cell.

If the relay cannot start or dies, the reader thread reads the pipes
itself (ipykernel's design: the deadlock above is back) and the kernel's
log says so once.

Threads: :func:`install` and :func:`flush` run on the main thread (a
forked child's flush does nothing); the reader thread is this module's
own. Linux only (memfd, SEEK_DATA, PUNCH_HOLE); elsewhere the reader
thread reads the pipes directly.

Runs on: the "trikernel-fd" reader thread; the main thread (:func:`install`,
:func:`start`); :func:`flush` on the thread that ran a request, before its
reply (it serialises); :func:`before_output` and :func:`statistics` any
thread.
"""

from __future__ import annotations

import codecs
import functools
import logging
import mmap
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trikernel.threads import not_traced

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.fdcapture")

#: Default bound on the backlog of one captured fd, bytes (``--fd-backlog-bytes``).
DEFAULT_BACKLOG = 64 << 20
#: Seconds a flush waits for the relay's answer before it reads what is there.
FLUSH_TIMEOUT = 2.0
#: Consumed bytes freed at once (fallocate PUNCH_HOLE), a multiple of the page size.
PUNCH_STEP = 1 << 20
#: Largest piece of text written into a stream at once, bytes.
READ_CHUNK = 1 << 16

_RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fdrelay.py")


@dataclass
class FdStats:
    """Counters of the fd capture; ``%trikernel`` shows each as
    ``fd_<field>``."""

    mode: str = "off"
    """``"relay"`` (the helper process drains the pipes), ``"direct"`` (a
    kernel thread reads them: the relay could not start or died), ``"off"``."""
    relay_pid: int = 0
    """The relay process (0 before it started or in direct mode)."""
    bytes: int = 0
    """Bytes read from fd 1 and 2 into the notebook."""
    dropped: int = 0
    """Bytes the relay dropped past ``--fd-backlog-bytes``."""
    flushes: int = 0
    """Flushes before a reply."""
    flush_timeouts: int = 0
    """Of ``flushes``, the ones the relay did not answer within FLUSH_TIMEOUT
    (waited for, or not asked again while an earlier question is unanswered)."""
    flush_waits: int = 0
    """Of ``flushes`` and ``orders``, the ones that asked the relay and waited for its answer."""
    orders: int = 0
    """Python-level writes that found fd output in flight and published it first
    (:func:`before_output`)."""


class _Captured:
    __slots__ = ("buf", "decoder", "fd", "name", "offset", "pipe", "punched")

    def __init__(self, fd: int, name: str, pipe: int, buf: int | None):
        self.fd = fd
        self.name = name
        self.pipe = pipe  # read end of the capture pipe (kept for the direct mode)
        self.buf = buf  # the relay's memfd, or None in direct mode
        self.offset = 0
        self.punched = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")


class FdCapture:
    """fd 1 and fd 2 into the notebook through the relay (see the module docstring).

    ``write(name, text)`` publishes text on stream ``name`` ("stdout" or
    "stderr"); it is called from the reader thread and from :meth:`flush`
    (main thread), never concurrently (a lock), and may block (IOPub
    backpressure). ``backlog``: bytes per fd before the relay drops.
    """

    def __init__(self, write: Callable[[str, str], None], *, backlog: int = DEFAULT_BACKLOG):
        self._write = write
        self._backlog = backlog
        self._lock = threading.Lock()  # one reader of the memfds/pipes at a time
        self._flush_lock = threading.Lock()  # one flush request in flight
        self._streams: list[_Captured] = []
        self._ctl = self._ack = self._bell = self._state = -1
        self._state_map: Any = None  # the state memfd, mapped (busy and gap bytes read without a syscall)
        # is either pipe readable now? (one syscall; any thread: an epoll may
        # be waited on by several threads at once, a select.poll may not)
        self._pipes_ready: Callable[[], Any] = tuple
        self._sizes_published = bytes(16)  # the relay's SIZES bytes once all it appended is published
        self._holders: set[int] = set()  # threads holding _lock or _flush_lock (no waiting for oneself)
        self._ordering = False  # started, and not a forked child: before_output works
        self._fast_map: Any = None  # the state map while ordering with a live relay (the fast check's)
        self._acks_owed = 0
        self._relay: Any = None  # the relay's first process (a subprocess.Popen) until reaped
        self._relay_alive = False
        self._forked = False
        self._warned = False
        self.stats = FdStats()

    # -- main thread, at start-up --------------------------------------------
    def redirect(self) -> tuple[int, int]:
        """Point fd 1 and 2 at new pipes; returns dups of their old targets."""
        saved = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            saved.append(os.dup(fd))
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.dup2(w, fd)  # inheritable: children write here
            os.close(w)
            self._streams.append(_Captured(fd, name, r, None))
        pipes = [s.pipe for s in self._streams]
        if hasattr(select, "epoll"):
            ep = select.epoll()
            for p in pipes:
                ep.register(p, select.EPOLLIN)
            self._pipes_ready = functools.partial(ep.poll, 0, 1)  # no timeout, at most one event
        else:
            self._pipes_ready = lambda: select.select(pipes, [], [], 0)[0]
        return saved[0], saved[1]

    def start(self, log_fd: int) -> None:
        """Start the relay (its errors go to ``log_fd``) and the reader thread."""
        os.register_at_fork(after_in_child=self._mark_forked)
        if sys.platform.startswith("linux"):
            try:
                self._start_relay(log_fd)
            except OSError as exc:
                log.warning("fd capture: the relay did not start (%s); reading fd 1/2 directly", exc)
        self.stats.mode = "relay" if self._relay_alive else "direct"
        self._ordering = True
        self._fast_map = self._state_map if self._relay_alive else None
        not_traced(threading.Thread(target=self._reader, name="trikernel-fd", daemon=True)).start()

    def _start_relay(self, log_fd: int) -> None:
        import subprocess  # already loaded by IPython

        out, err = self._streams
        out.buf = out_buf = os.memfd_create("trikernel-fd1", os.MFD_CLOEXEC)
        err.buf = err_buf = os.memfd_create("trikernel-fd2", os.MFD_CLOEXEC)
        self._state = os.memfd_create("trikernel-fd-state", os.MFD_CLOEXEC)
        os.ftruncate(self._state, _STATE_SIZE)  # mapped below: every byte read must exist
        # "busy" until the relay runs (it clears busy and gaps when it starts):
        # the first flushes ask it, and so wait until it runs, as with the empty
        # memfd the pread of earlier versions read
        os.pwrite(self._state, b"\1", _BUSY)
        ctl_r, self._ctl = os.pipe()
        self._ack, ack_w = os.pipe()
        self._bell, bell_w = os.pipe()
        fds = [out.pipe, out_buf, err.pipe, err_buf, ctl_r, ack_w, bell_w, self._state]
        try:
            self._relay = subprocess.Popen(
                [sys.executable, "-I", "-S", _RELAY, str(self._backlog), *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_fd,
                cwd="/",
                start_new_session=True,  # the interrupt's SIGINT to our process group is not for it
            )
        except BaseException:
            for s in self._streams:
                if s.buf is not None:
                    os.close(s.buf)
                s.buf = None
            os.close(self._ctl)
            os.close(self._ack)
            os.close(self._bell)
            raise
        finally:
            for fd in (ctl_r, ack_w, bell_w):
                os.close(fd)  # the relay holds them now: EOF on bell/ack means it is gone
        self._state_map = mmap.mmap(self._state, _STATE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        self._relay_alive = True

    def _mark_forked(self) -> None:
        self._forked = True
        self._ordering = False
        self._fast_map = None

    # -- reader thread ----------------------------------------------------------
    def _reader(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # SIGINT is the main thread's
        if self._relay is not None:
            self._relay.wait()  # its first process exits at once (the relay detaches)
            self._relay = None
        while self._relay_alive:
            try:
                rang = os.read(self._bell, 4096)
            except OSError:
                rang = b""
            if not rang:
                self._relay_gone("its doorbell closed")
                break
            self.drain()
        self._read_pipes_forever()

    def _relay_gone(self, why: str) -> None:
        with self._lock:
            if not self._relay_alive:
                return
            self._relay_alive = False
            self._fast_map = None
            self.stats.mode = "direct"
        log.warning("fd capture: the relay stopped (%s); reading fd 1/2 directly from now on", why)
        self.drain()  # what it appended before it stopped

    def _read_pipes_forever(self) -> None:
        """Direct mode: read the capture pipes from this thread (needs the GIL)."""
        poller = select.poll()
        for s in self._streams:
            poller.register(s.pipe, select.POLLIN)
        while True:
            poller.poll()
            self.drain()

    # -- both -------------------------------------------------------------------
    def drain(self) -> None:
        """Publish what the memfds (relay) or the pipes (direct mode) hold now."""
        me = threading.get_ident()
        with self._lock:
            self._holders.add(me)
            try:
                for s in self._streams:
                    if self._relay_alive and s.buf is not None:
                        self._drain_buf(s)
                    else:
                        if s.buf is not None:
                            self._drain_buf(s)  # leftovers of a relay that stopped
                        self._drain_pipe(s)
            finally:
                out, err = self._streams
                self._sizes_published = out.offset.to_bytes(8, "little") + err.offset.to_bytes(8, "little")
                self._holders.discard(me)

    def _drain_buf(self, s: _Captured) -> None:
        assert s.buf is not None
        if self._relay_alive:
            # the relay's count of bytes appended (written after the bytes):
            # no syscall, each of which lets another thread take the GIL
            at = _SIZES + 8 * (s.fd - 1)
            size = int.from_bytes(self._state_map[at : at + 8], "little")
        else:  # what a relay that stopped appended, counted or not
            size = os.fstat(s.buf).st_size
        while s.offset < size:
            data = os.pread(s.buf, min(size - s.offset, READ_CHUNK), s.offset)
            if not data:
                break
            self._publish(s, data)
            s.offset += len(data)
        if s.offset - s.punched >= PUNCH_STEP:
            end = s.offset - s.offset % PUNCH_STEP
            _punch_hole(s.buf, s.punched, end - s.punched)
            s.punched = end

    def _drain_pipe(self, s: _Captured) -> None:
        while True:
            try:
                data = os.read(s.pipe, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                return
            self._publish(s, data)

    def _publish(self, s: _Captured, data: bytes) -> None:
        # all or nothing: an interrupt while ``write`` waits for IOPub credit
        # (main thread) leaves the decoder as it was, and the caller does not
        # advance past ``data`` (the memfd keeps it for the next drain)
        state = s.decoder.getstate()
        try:
            text = s.decoder.decode(data)
            if text:
                self._write(s.name, text)
        except BaseException:
            s.decoder.setstate(state)
            raise
        self.stats.bytes += len(data)

    # -- main thread, before a reply -------------------------------------------
    def flush(self) -> None:
        """Publish every byte written to fd 1/2 before this call (exact).

        Main thread (any thread may call it; it serialises). Blocks until
        the relay has emptied the pipes, at most FLUSH_TIMEOUT seconds; an
        interrupt meanwhile stops it (the request's code has finished; as
        when idle, the interrupt is ignored; what is left is published by the
        next drain). Never raises. Does nothing in a forked child.
        """
        if self._forked or not self._streams:
            return
        self.stats.flushes += 1
        try:
            self._collect()
        except KeyboardInterrupt:
            # what was not published stays in the memfd for the next drain
            log.info("interrupt while collecting fd output: ignored")
        except Exception:
            log.exception("fd capture: flush failed")

    def _collect(self) -> None:
        """Publish every byte written to fd 1/2 before this call: ask the relay
        to empty the pipes (unless nothing is in flight), then read the memfds
        (relay) or the pipes (direct mode) to their end. Blocks at most
        FLUSH_TIMEOUT for the relay; KeyboardInterrupt and errors propagate."""
        me = threading.get_ident()
        with self._flush_lock:
            self._holders.add(me)
            try:
                if self._relay_alive and not self._nothing_in_flight():
                    try:
                        self._ask_relay()
                    except OSError as exc:
                        self._relay_gone(f"control pipe: {exc.strerror}")
                self.drain()
            finally:
                self._holders.discard(me)

    # -- any thread, before Python-level output --------------------------------
    def before_output(self) -> None:
        """Publish the fd 1/2 bytes written before this call, if any are not yet
        published, so that the Python-level output the caller is about to
        queue comes after them (the module docstring, "order").

        Any thread but the io thread (the caller's check). Cost when nothing
        is in flight: one ``epoll_wait`` with no timeout and two reads of
        the relay's state page (the order of the checks is what makes them
        exact, see the comment inside); else a flush (at most FLUSH_TIMEOUT
        waiting for the relay, which never waits for the kernel). Does
        nothing in a forked child, before :meth:`start`, and in a thread that
        is itself collecting (a signal handler or ``__del__`` that prints
        from inside a drain: it cannot wait for itself). Raises
        KeyboardInterrupt if one arrives meanwhile (what was not published
        stays for the next collect).
        """
        # The fast path is every print's cost, so it is inline. Every byte
        # written before this call has been published when, checked in this
        # order: neither pipe is readable (so each such byte has left its
        # pipe); then the relay's busy and gap bytes are clear (each byte it
        # read from a pipe is in a memfd with its count written, and no drop
        # notice is due), and its counts of bytes appended equal the offsets
        # published so far (advanced once the text is queued). Two slices,
        # not one: the busy byte must be read before the counts.
        m = self._fast_map
        if m is not None and not self._pipes_ready() and m[_FLAGS] == b"\0\0\0" and m[_COUNTS] == self._sizes_published:
            return
        self._before_output_slow()

    def _before_output_slow(self) -> None:
        if not self._ordering:
            return
        if not self._relay_alive and not self._pipes_ready() and not self._lock.locked():
            return  # direct mode: pipes empty, and no drain between its read and its publish
        if threading.get_ident() in self._holders:
            return
        self.stats.orders += 1
        self._collect()

    def _nothing_in_flight(self) -> bool:
        """True if every byte written to the pipes so far is in the memfds
        already, so the flush need not ask the relay (one syscall instead of
        a round trip to another process). Checked in this order: neither
        pipe readable (one ``epoll_wait`` of both), then the relay's busy byte
        clear — it is set before each pipe read and cleared after the
        append, so a byte that left a pipe before the first check is in a
        memfd unless the byte is set — and no drop notice due (the relay
        writes it when asked). The busy byte starts set (the relay clears it
        when it runs), so flushes before then ask the relay and wait for it.
        The state bytes are read from a shared
        mapping of the state memfd, which the relay writes with ``pwrite``: the
        same page, no syscall (issue 12: each syscall on the path before a
        reply lets the io thread take the GIL)."""
        if self._acks_owed:
            return False
        if self._pipes_ready():
            return False
        return bool(self._state_map[_FLAGS] == b"\0\0\0")  # not busy, no notice due

    def _ask_relay(self) -> None:
        """One flush request and its answer. While an earlier request is
        still unanswered (the relay timed out: stopped, or starved of CPU),
        do not wait again: read what is there, counted as a timeout, until
        it answers. So a stuck relay costs one FLUSH_TIMEOUT, not one per request."""
        if self._acks_owed and select.select([self._ack], [], [], 0)[0]:
            self._take_acks()
        if self._acks_owed:
            self.stats.flush_timeouts += 1
            return
        os.write(self._ctl, b"F")
        self._acks_owed = 1
        self.stats.flush_waits += 1
        self._wait_acks()

    def _take_acks(self) -> None:
        got = os.read(self._ack, 4096)
        if not got:
            self._relay_gone("its ack pipe closed")
            self._acks_owed = 0
            return
        self._acks_owed -= min(len(got), self._acks_owed)

    def _wait_acks(self) -> None:
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while self._acks_owed and self._relay_alive:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._ack], [], [], left)[0]:
                self.stats.flush_timeouts += 1
                if not self._warned:
                    self._warned = True
                    log.warning("fd capture: the relay did not answer a flush within %.1fs", FLUSH_TIMEOUT)
                return
            self._take_acks()

    def statistics(self) -> FdStats:
        """The counters, with the relay's drop count and pid read now (the
        pid is 0 until the relay runs: the first flush waits for that).
        Any thread; never blocks."""
        if self._state >= 0:
            raw = os.pread(self._state, 24, 0)
            if len(raw) == 24:
                self.stats.dropped = int.from_bytes(raw[:8], "little") + int.from_bytes(raw[8:16], "little")
                self.stats.relay_pid = int.from_bytes(raw[16:], "little") if self._relay_alive else 0
        return self.stats


#: Offset of the relay's busy byte in the state memfd, then its two gap
#: bytes (_fdrelay.BUSY, _fdrelay.GAP).
_BUSY = 24
#: Offset of the relay's two u64 counts of bytes appended (_fdrelay.SIZES).
_SIZES = 32
#: The busy and gap bytes, then the counts, of the state memfd.
_FLAGS = slice(_BUSY, _BUSY + 3)
_COUNTS = slice(_SIZES, _SIZES + 16)
#: Bytes of the state memfd (set at creation; the relay writes bytes 0..47).
_STATE_SIZE = 64


_libc: Any = None


def _punch_hole(fd: int, offset: int, length: int) -> None:
    """Free ``length`` bytes at ``offset`` of memfd ``fd`` (the file keeps its size)."""
    global _libc
    if length <= 0:
        return
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    falloc_fl_keep_size, falloc_fl_punch_hole = 1, 2
    if _libc.fallocate(fd, falloc_fl_keep_size | falloc_fl_punch_hole, offset, length) != 0:
        log.debug("fd capture: fallocate(PUNCH_HOLE) failed: errno %d", _libc_errno())


def _libc_errno() -> int:
    import ctypes

    return ctypes.get_errno()


#: The kernel's capture, once installed (outstream.install).
_capture: FdCapture | None = None


def install(write: Callable[[str, str], None], *, backlog: int = DEFAULT_BACKLOG) -> tuple[int, int]:
    """Capture fd 1 and 2; returns dups of their old targets (the kernel's terminal).

    Call :func:`start` once the streams that ``write`` uses exist.
    """
    global _capture
    _capture = FdCapture(write, backlog=backlog)
    return _capture.redirect()


def start(log_fd: int) -> None:
    """Start the capture :func:`install` set up: the relay process (Linux; its own errors go to
    ``log_fd``, the kernel's saved stderr) and the "trikernel-fd" reader thread; without the
    relay the reader reads the pipes itself (``fd_mode: direct``). Main thread, once, after
    :func:`install` and once the streams exist (outstream.py); AssertionError before
    :func:`install`."""
    assert _capture is not None
    _capture.start(log_fd)


def flush() -> None:
    """Publish all fd 1/2 output written so far (no-op when fds are not captured)."""
    if _capture is not None:
        _capture.flush()


def _nothing() -> None:
    pass


def order_hook() -> Callable[[], None]:
    """:func:`before_output` bound to the installed capture (one call less per
    write), or a function that does nothing when fds are not captured. Any thread."""
    return _capture.before_output if _capture is not None else _nothing


def before_output() -> None:
    """Publish fd 1/2 output written before this call and not yet published,
    so that the Python-level output about to be queued follows it
    (:meth:`FdCapture.before_output`; no-op when fds are not captured). Any
    thread but the io thread; KeyboardInterrupt may propagate."""
    if _capture is not None:
        _capture.before_output()


def statistics() -> FdStats:
    """The fd capture's counters (:class:`FdStats`, bytes and flush counts since start-up; the
    relay's drop count and pid read now), or a fresh one (``mode`` "off", every count 0) when
    fd 1/2 are not captured (``--no-capture-fd``). Any thread; never blocks."""
    return _capture.statistics() if _capture is not None else FdStats()
