"""The shorter thread switch interval while a shell request runs long
(switchinterval.py, docs/design.md "The GIL").

Tier 1: SwitchIntervals on its own (nesting, overlap, an interval set by
someone else). Tier 3: a real kernel, the interval read by its cells.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest
from conftest import execute

from trikernel.config import KernelConfig
from trikernel.switchinterval import LONG_REQUEST, SwitchIntervals

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(120)

BUSY = KernelConfig().busy_switch_interval
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


def test_the_busy_interval_holds_while_any_long_request_runs(interval: None) -> None:
    s = SwitchIntervals(0.0002)
    first = s.long_request()
    second = s.long_request()
    first.__enter__()
    assert close(sys.getswitchinterval(), 0.0002)
    second.__enter__()  # a subshell's long cell beside the main shell's
    first.__exit__(None, None, None)
    assert close(sys.getswitchinterval(), 0.0002), "one long request still runs"
    second.__exit__(None, None, None)
    assert close(sys.getswitchinterval(), 0.001)
    assert not s.active


def test_an_interval_changed_during_a_long_request_is_kept(interval: None) -> None:
    s = SwitchIntervals(0.0002)
    with s.long_request():
        sys.setswitchinterval(0.01)  # the cell's own choice
    assert close(sys.getswitchinterval(), 0.01)


def test_an_interval_already_shorter_is_left_alone(interval: None) -> None:
    sys.setswitchinterval(0.0001)
    s = SwitchIntervals(0.0002)
    with s.long_request():
        assert close(sys.getswitchinterval(), 0.0001)
    assert close(sys.getswitchinterval(), 0.0001)


def test_the_interval_is_put_back_when_the_request_raises(interval: None) -> None:
    s = SwitchIntervals(0.0002)
    with pytest.raises(RuntimeError), s.long_request():
        raise RuntimeError("cancelled or failed")
    assert close(sys.getswitchinterval(), 0.001)


# ------------------------------------------------------------- a real kernel


def expr(kc: Any, code: str, expression: str) -> str:
    reply, _ = execute(kc, code, user_expressions={"v": expression})
    content = reply["content"]
    assert content["status"] == "ok", content
    return str(content["user_expressions"]["v"]["data"]["text/plain"])


WAIT_FOR_BUSY = f"""
import sys, time
_deadline = time.monotonic() + 20
while sys.getswitchinterval() > {BUSY * 1.5!r} and time.monotonic() < _deadline:
    time.sleep(0.005)
"""


def test_a_long_cell_runs_with_the_busy_interval_and_the_next_short_one_does_not(kernel: Any) -> None:
    _km, kc = kernel
    assert LONG_REQUEST < 0.05
    seen = float(expr(kc, WAIT_FOR_BUSY, "sys.getswitchinterval()"))
    assert close(seen, BUSY), seen
    # a short cell normally ends inside LONG_REQUEST; on a loaded machine one
    # may not, so a few tries: the interval must be back for one of them
    values = [float(expr(kc, "", "__import__('sys').getswitchinterval()")) for _ in range(10)]
    assert any(close(v, IDLE) for v in values), values


def test_an_interval_a_long_cell_sets_itself_stays(kernel: Any) -> None:
    _km, kc = kernel
    try:
        code = WAIT_FOR_BUSY + "sys.setswitchinterval(0.004)\ntime.sleep(0.05)\n"
        assert close(float(expr(kc, code, "sys.getswitchinterval()")), 0.004)
        # (a short cell that runs past LONG_REQUEST on a loaded machine has the busy one)
        values = [float(expr(kc, "", "__import__('sys').getswitchinterval()")) for _ in range(10)]
        assert any(close(v, 0.004) for v in values), values
        assert all(close(v, 0.004) or close(v, BUSY) for v in values), values
    finally:
        expr(kc, f"import sys; sys.setswitchinterval({IDLE!r})", "1")
