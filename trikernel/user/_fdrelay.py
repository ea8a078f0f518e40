"""The fd relay: a helper *process* that drains the kernel's fd 1/2 pipes.

Runs as ``python -I -S _fdrelay.py ARGS`` (standard library only), started by
fdcapture.py; it detaches (forks once, the first process exits) so it is not
the kernel's child, and runs in its own session so the interrupt's SIGINT to
the kernel's process group does not reach it.

Why a process: the writer of fd 1 may be C code that holds the GIL (a
``printf`` loop through ``ctypes.PyDLL``). A pipe drained by a thread of the
kernel needs that GIL, so past the pipe's 64 KiB the writer blocks in
``write()`` for good (ipykernel has the same bug; wurlitzer#48). This process
has its own GIL: it always drains the pipes, so a writer never waits on the
kernel.

What it does, for each captured fd (1 and 2):

- reads the capture pipe (non-blocking) and appends what it read to a
  memfd at its own offset (``pwrite``); the kernel reads that memfd at *its*
  offset (``pread``) and frees what it consumed with
  ``fallocate(PUNCH_HOLE)``;
- rings the doorbell pipe (one byte, non-blocking; a full doorbell is
  already ringing) after every copy, so the kernel's reader wakes;
- **bound**: the backlog (bytes appended minus bytes the kernel freed,
  found with ``lseek(SEEK_DATA)``, so within one punch step) never exceeds
  ``limit``. Past it the relay keeps reading the pipe — the writer never
  blocks — and drops what it read, counting it, until the backlog is back
  under ``limit // 2``; then it appends one line saying how many bytes were
  dropped, where they were, and carries on;
- **flush**: for every ``F`` byte on the control pipe it reads from each
  pipe as many bytes as it held when the request was read (``FIONREAD``:
  everything written before the request was sent is in them; bounded, so a
  writer that keeps the pipe full cannot hold the answer back), appends
  them, and answers one ``A`` byte on the ack pipe. So the kernel can read,
  before a cell's reply or a Python-level write, every byte written before
  it.

It exits when the control pipe reaches EOF (the kernel is gone).

Counts: the total bytes dropped per fd are kept in the state memfd (two
little-endian u64 at offsets 0 and 8, fd 1 then fd 2), which the kernel
reads for ``%trikernel``; at offset 16, the relay's pid; at 24, the busy
byte (1 from before a pipe read until its bytes are in the memfd); at 25
and 26, a gap byte per fd (1 while dropped bytes wait for their notice); at
32 and 40, the bytes appended to each memfd so far (little-endian u64, fd 1
then fd 2; written after each append, before the busy byte is cleared), so
the kernel can tell without a syscall whether it has published everything
appended. A failed append (no memory) counts as a drop.

argv: ``limit out_pipe out_buf err_pipe err_buf ctl ack bell state`` (ints;
fd numbers inherited from the kernel).

Runs on: the fd relay, a process of its own (``python -I -S``, detached
from the kernel, one thread); nothing here runs in the kernel.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import os
import select
import signal
import sys
import termios

#: Largest read from a capture pipe at once, bytes.
CHUNK = 1 << 20
#: Offsets in the state memfd: the busy byte, then one gap byte per fd,
#: then one u64 per fd: bytes appended to its memfd.
BUSY = 24
GAP = 25
SIZES = 32


def _notice(fd: int, dropped: int, limit: int) -> bytes:
    return (
        f"\n[trikernel: {dropped} bytes written to fd {fd} were dropped here: more than "
        f"{limit} bytes were waiting for the notebook (--fd-backlog-bytes)]\n"
    ).encode()


class _Stream:
    """One captured fd: its pipe (read end) and its memfd."""

    __slots__ = ("buf", "dropped", "dropping", "fd", "pipe", "size", "state", "total_dropped")

    def __init__(self, fd: int, pipe: int, buf: int, state: int) -> None:
        self.fd = fd
        self.state = state
        self.pipe = pipe
        self.buf = buf
        self.size = os.fstat(buf).st_size
        self.dropped = 0  # bytes dropped in the current gap
        self.total_dropped = 0
        self.dropping = False
        os.set_blocking(pipe, False)

    def backlog(self) -> int:
        """Bytes appended that the kernel has not freed yet (within one punch step)."""
        try:
            first_data = os.lseek(self.buf, 0, os.SEEK_DATA)  # nobody uses this OFD's offset
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # all holes: everything was consumed
                return 0
            raise
        return self.size - first_data

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.pwrite(self.buf, view, self.size)
                self.size += n
                view = view[n:]
        finally:
            # what the kernel's check before a Python-level write compares with
            # what it has published (fdcapture.FdCapture.before_output)
            os.pwrite(self.state, self.size.to_bytes(8, "little"), SIZES + 8 * (self.fd - 1))

    def take(self, data: bytes, limit: int, *, force_notice: bool = False) -> None:
        """Append ``data`` unless that would exceed ``limit``; count drops."""
        backlog = self.backlog()
        if self.dropping and backlog <= limit // 2:
            self._end_gap(limit)
        elif not self.dropping and backlog + len(data) > limit:
            self._start_gap()
        if not self.dropping and data:
            try:
                self.append(data)
                return
            except OSError:  # ENOMEM/ENOSPC: count it as dropped
                self._start_gap()
        if self.dropping:
            self._count(len(data))
            if force_notice:
                self._end_gap(limit)

    def _start_gap(self) -> None:
        self.dropping = True
        os.pwrite(self.state, b"\1", GAP + self.fd - 1)  # the kernel's flush must ask: a notice is due

    def _count(self, n: int) -> None:
        if n:
            self.dropped += n
            self.total_dropped += n
            os.pwrite(self.state, self.total_dropped.to_bytes(8, "little"), 8 * (self.fd - 1))

    def _end_gap(self, limit: int) -> None:
        if self.dropped:
            try:
                self.append(_notice(self.fd, self.dropped, limit))
            except OSError:
                return  # still no room: stay in the gap
        self.dropped = 0
        self.dropping = False
        os.pwrite(self.state, b"\0", GAP + self.fd - 1)

    def copy(self, limit: int) -> int:
        """Read what the pipe holds now (at most CHUNK); returns bytes read, -1 at EOF.

        The busy byte is set before the read and cleared after the append:
        while it is clear, nothing read from a pipe is outside the memfds
        (the kernel's flush skips asking when the pipes are empty too)."""
        os.pwrite(self.state, b"\1", BUSY)
        try:
            data = os.read(self.pipe, CHUNK)
        except BlockingIOError:
            return 0
        else:
            if not data:
                return -1
            self.take(data, limit)
            return len(data)
        finally:
            os.pwrite(self.state, b"\0", BUSY)

    def drain(self, limit: int) -> None:
        """Read what the pipe holds now (a flush request): at least the bytes it
        held on entry, so that everything written before the request is in the
        memfd, and then stop even if a writer keeps filling it."""
        want = _unread(self.pipe)
        while want > 0:
            n = self.copy(limit)
            if n <= 0:
                break
            want -= n
        if self.dropping:
            # show the gap before the cell's reply even if the backlog is still high
            self.take(b"", limit, force_notice=True)


def _unread(pipe: int) -> int:
    """Bytes waiting in ``pipe`` (FIONREAD)."""
    n = array.array("i", [0])
    fcntl.ioctl(pipe, termios.FIONREAD, n, True)
    return n[0]


def main(argv: list[str]) -> int:
    """The relay's whole life. ``argv``: ``limit out_pipe out_buf err_pipe err_buf ctl ack bell
    state`` (the backlog bound in bytes, then inherited fd numbers). Ignores SIGINT, SIGHUP
    and SIGTERM, forks once (the first process exits, so the relay is not the kernel's child),
    then copies both pipes into their memfds, rings the doorbell and answers each ``F`` flush
    byte with one ``A``. Returns 0 when the control pipe reaches EOF (the kernel is gone)."""
    limit, out_pipe, out_buf, err_pipe, err_buf, ctl, ack, bell, state = (int(a) for a in argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # we end at the control pipe's EOF, after the kernel
    if os.fork():
        os._exit(0)  # the kernel reaps this one; the relay is nobody's child of the kernel
    os.pwrite(state, os.getpid().to_bytes(8, "little") + b"\0\0\0", 16)  # the pid; busy, gaps: clear
    streams = {out_pipe: _Stream(1, out_pipe, out_buf, state), err_pipe: _Stream(2, err_pipe, err_buf, state)}
    os.set_blocking(bell, False)
    poller = select.poll()
    for p in (ctl, out_pipe, err_pipe):
        poller.register(p, select.POLLIN)
    while True:
        copied = False
        for p, _ in poller.poll():
            if p == ctl:
                req = os.read(ctl, 256)
                if not req:
                    return 0  # the kernel is gone
                for s in streams.values():
                    s.drain(limit)
                os.write(ack, b"A" * req.count(b"F"))
                copied = True
                continue
            n = streams[p].copy(limit)
            if n < 0:
                poller.unregister(p)  # every writer closed it (kernel exiting)
            copied = copied or n > 0
        if copied:
            with contextlib.suppress(BlockingIOError):  # the doorbell is already ringing
                os.write(bell, b"\0")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        sys.exit(0)  # the kernel closed the ack or doorbell pipe: it is gone
