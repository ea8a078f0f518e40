"""The shorter thread switch interval while a control request is
answered (switchinterval.py, docs/design.md "The GIL").

Tier 1: SwitchIntervals on its own (idempotence, an interval set by
someone else). Tier 3: a real kernel, the interval read by its cells.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import TIMEOUT, execute

from trikernel.launch.config import KernelConfig
from trikernel.server.switchinterval import SwitchIntervals

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(120)

SHORT = KernelConfig().control_switch_interval
IDLE = KernelConfig().switch_interval


@pytest.fixture
def interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def close(a: float, b: float) -> bool:
    return round(a * 1e6) == round(b * 1e6)  # the interpreter keeps microseconds


def test_shorten_then_restore_puts_the_interval_back(interval: None) -> None:
    s = SwitchIntervals(0.0002)
    s.shorten()
    s.shorten()  # a second wake before the request was answered
    assert close(sys.getswitchinterval(), 0.0002)
    assert s.shortened
    s.restore()
    assert close(sys.getswitchinterval(), 0.001)
    s.restore()  # nothing to put back
    assert close(sys.getswitchinterval(), 0.001)
    assert not s.shortened


def test_an_interval_changed_while_shortened_is_kept(interval: None) -> None:
    s = SwitchIntervals(0.0002)
    s.shorten()
    sys.setswitchinterval(0.01)  # a cell's own choice, made meanwhile
    s.restore()
    assert close(sys.getswitchinterval(), 0.01)


def test_an_interval_already_shorter_is_left_alone(interval: None) -> None:
    sys.setswitchinterval(0.0001)
    s = SwitchIntervals(0.0002)
    s.shorten()
    assert close(sys.getswitchinterval(), 0.0001)
    s.restore()
    assert close(sys.getswitchinterval(), 0.0001)


# ------------------------------------------------------------- a real kernel

SAMPLER = f"""
import sys, time
_seen = []
_deadline = time.monotonic() + 20
while time.monotonic() < _deadline:
    _v = round(sys.getswitchinterval() * 1e6)
    if not _seen or _seen[-1] != _v:
        _seen.append(_v)
    if len(_seen) >= 3 and _seen[-1] == round({IDLE!r} * 1e6):
        break
"""


def test_the_interval_is_short_while_control_answers_and_back_after(kernel: Any) -> None:
    """A computing cell samples the interval while this test asks
    kernel_info on control: it sees the short one, then the usual one."""
    _km, kc = kernel
    msg_id = kc.execute(SAMPLER, user_expressions={"v": "_seen"})
    deadline = time.monotonic() + 30
    reply = None
    while reply is None and time.monotonic() < deadline:
        kc.control_channel.send(kc.session.msg("kernel_info_request"))
        with contextlib.suppress(queue.Empty):
            kc.get_control_msg(timeout=5)
        with contextlib.suppress(queue.Empty):
            got = kc.get_shell_msg(timeout=0.05)
            if got["parent_header"].get("msg_id") == msg_id:
                reply = got
    assert reply is not None, "the sampling cell never ended"
    content = reply["content"]
    assert content["status"] == "ok", content
    seen = [int(v) for v in content["user_expressions"]["v"]["data"]["text/plain"].strip("[]").split(",")]
    assert round(SHORT * 1e6) in seen, seen
    assert seen[-1] == round(IDLE * 1e6), seen


def test_an_interval_a_cell_sets_itself_stays(kernel: Any) -> None:
    _km, kc = kernel
    try:
        reply, _ = execute(kc, "import sys; sys.setswitchinterval(0.004)")
        assert reply["content"]["status"] == "ok"
        for _ in range(3):  # control requests shorten and restore around it
            kc.control_channel.send(kc.session.msg("kernel_info_request"))
            kc.get_control_msg(timeout=TIMEOUT)
        reply, _ = execute(kc, "", user_expressions={"v": "__import__('sys').getswitchinterval()"})
        assert close(float(reply["content"]["user_expressions"]["v"]["data"]["text/plain"]), 0.004)
    finally:
        execute(kc, f"import sys; sys.setswitchinterval({IDLE!r})")


def test_a_control_wake_up_without_a_request_leaves_the_interval_alone(kernel: Any) -> None:
    """A peer connecting to control (a second frontend, a probe) wakes the
    control task with no message: the interval was left short until the
    next control request (found by review)."""
    import zmq

    km, kc = kernel
    info = km.get_connection_info()
    ctx = zmq.Context()
    try:
        for _ in range(3):
            peer = ctx.socket(zmq.DEALER)
            peer.linger = 0
            peer.connect(f"{info['transport']}://{info['ip']}:{info['control_port']}")
            time.sleep(0.2)
            reply, _ = execute(kc, "", user_expressions={"v": "__import__('sys').getswitchinterval()"})
            assert close(float(reply["content"]["user_expressions"]["v"]["data"]["text/plain"]), IDLE)
            peer.close()
            time.sleep(0.2)
            reply, _ = execute(kc, "", user_expressions={"v": "__import__('sys').getswitchinterval()"})
            assert close(float(reply["content"]["user_expressions"]["v"]["data"]["text/plain"]), IDLE)
    finally:
        ctx.term()
