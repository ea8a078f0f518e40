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
