"""The fd relay's bound and gap notices, in process (tier 2: real pipes and
memfds, no kernel). The relay is exercised end to end by test_output_fd.py."""

from __future__ import annotations

import os
import re
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd, SEEK_DATA, PUNCH_HOLE")

from trikernel.user import _fdrelay, fdcapture  # noqa: E402

LIMIT = 1 << 20


@pytest.fixture
def stream():
    r, w = os.pipe()
    buf = os.memfd_create("test-fd1")
    state = os.memfd_create("test-state")
    s = _fdrelay._Stream(1, r, buf, state)
    yield s, w
    for fd in (r, w, buf, state):
        os.close(fd)


def _consume(s: _fdrelay._Stream, upto: int) -> None:
    """What the kernel does after reading: free the consumed pages."""
    fdcapture._punch_hole(s.buf, 0, upto - upto % fdcapture.PUNCH_STEP)


def _text(s: _fdrelay._Stream) -> bytes:
    return os.pread(s.buf, s.size, 0)


def test_under_the_bound_everything_is_appended(stream):
    s, _ = stream
    for _ in range(10):
        s.take(b"a" * 1000, LIMIT)
    assert _text(s) == b"a" * 10000
    assert s.total_dropped == 0


def test_past_the_bound_the_rest_is_dropped_counted_then_announced(stream):
    s, _ = stream
    chunk = b"b" * 65536
    for _ in range(32):  # 2 MiB into a 1 MiB bound, nothing consumed
        s.take(chunk, LIMIT)
    kept = s.size
    assert kept <= LIMIT
    assert s.dropping
    assert s.total_dropped == 32 * len(chunk) - kept
    assert os.pread(s.state, 1, _fdrelay.GAP) == b"\1"  # the kernel's flush must ask
    # the kernel catches up: below half the bound, the gap ends with one notice line
    _consume(s, s.size)
    s.take(b"after\n", LIMIT)
    tail = _text(s)[kept:]
    m = re.match(rb"\n\[trikernel: (\d+) bytes written to fd 1 were dropped here[^\n]*\]\nafter\n$", tail)
    assert m, tail
    assert int(m.group(1)) == s.total_dropped
    assert os.pread(s.state, 8, 0) == s.total_dropped.to_bytes(8, "little")
    assert os.pread(s.state, 1, _fdrelay.GAP) == b"\0"


def test_a_flush_during_a_gap_announces_it_at_once(stream):
    s, w = stream
    for _ in range(20):
        s.take(b"c" * 65536, LIMIT)
    assert s.dropping
    os.write(w, b"d" * 1000)
    s.drain(LIMIT)  # a flush request: the pipe is read empty, the notice written
    assert b"bytes written to fd 1 were dropped here" in _text(s)
    assert not s.dropping


def test_copy_sets_busy_only_while_bytes_are_outside_the_memfd(stream):
    s, w = stream
    os.write(w, b"e" * 100)
    assert s.copy(LIMIT) == 100
    assert os.pread(s.state, 1, _fdrelay.BUSY) == b"\0"
    assert s.copy(LIMIT) == 0  # empty pipe
    assert _text(s) == b"e" * 100


def test_appended_bytes_are_counted_in_the_state_page(stream):
    """The kernel's check before a Python-level write compares these counts
    with what it has published (fdcapture.FdCapture._settled)."""
    s, w = stream
    os.write(w, b"f" * 300)
    assert s.copy(LIMIT) == 300
    assert os.pread(s.state, 8, _fdrelay.SIZES) == (300).to_bytes(8, "little")
    for _ in range(20):  # into a gap, then out of it with a notice
        s.take(b"g" * 65536, LIMIT)
    _consume(s, s.size)
    s.take(b"h", LIMIT)
    assert os.pread(s.state, 8, _fdrelay.SIZES) == s.size.to_bytes(8, "little")
    assert s.size == len(_text(s))


def test_a_flush_reads_what_the_pipe_held_and_stops_though_a_writer_keeps_filling_it(stream, monkeypatch):
    """A flush request must end while a writer keeps the pipe full (before,
    the relay read "until empty", which such a writer never lets happen)."""
    s, w = stream
    os.write(w, b"i" * 5000)
    copy = _fdrelay._Stream.copy
    calls = []

    def copy_then_refill(self: _fdrelay._Stream, limit: int) -> int:
        calls.append(1)
        assert len(calls) < 1000, "the flush did not stop"
        n = copy(self, limit)
        os.write(w, b"j" * 100)  # the writer, between two reads
        return n

    monkeypatch.setattr(_fdrelay._Stream, "copy", copy_then_refill)
    s.drain(LIMIT)
    assert _text(s)[:5000] == b"i" * 5000  # all that was there before the request
    assert len(calls) == 1
