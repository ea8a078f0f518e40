"""lanestate.py in process (tier 2): per-lane execution counts, attributes and input routing.

A "lane" is the context variable ``current_lane``; a subshell's thread sets
its own, as subshells.SubshellRun does. The counting follows IPython 9's
run_cell_async: read ``execution_count`` at the start, then ``+= 1``.
"""

from __future__ import annotations

import builtins
import threading
from typing import TYPE_CHECKING, Any

from trikernel.user import lanestate
from trikernel.user.lanestate import ExecutionCount, LaneState, PerLane, cell, current_lane, route_input

if TYPE_CHECKING:
    import pytest


class Shell:
    execution_count = ExecutionCount()
    _last_traceback = PerLane(lambda shell: [])


def ipython_cell(shell: Shell) -> int:
    """What IPython's run_cell_async does with the count of a stored cell."""
    number = shell.execution_count
    shell.execution_count += 1
    return int(number)


def in_subshell_thread(fn: Any) -> Any:
    """Run ``fn()`` on a thread with a subshell lane of its own; return its result."""
    out: list[Any] = []

    def target() -> None:
        current_lane.set(LaneState("sub"))
        out.append(fn())

    t = threading.Thread(target=target)
    t.start()
    t.join(10)
    assert not t.is_alive()
    return out[0]


def test_overlapping_cells_take_distinct_numbers() -> None:
    shell = Shell()
    with cell(shell, store_history=True) as main_number:
        assert (main_number, shell.execution_count) == (1, 1)

        def sub() -> tuple[int, int, int]:
            with cell(shell, store_history=True) as n:
                seen = ipython_cell(shell)
                return n, seen, shell.execution_count - 1  # what the reply reports

        assert in_subshell_thread(sub) == (2, 2, 2)
        assert ipython_cell(shell) == 1  # the main cell still sees its own number
        assert shell.execution_count - 1 == 1
    assert shell.execution_count == 3  # the next cell's, kernel-wide


def test_a_cell_that_stores_nothing_gives_its_number_back() -> None:
    shell = Shell()
    with cell(shell, store_history=True) as n:
        pass  # an empty cell: IPython does not increment
    assert (n, shell.execution_count) == (1, 1)
    with cell(shell, store_history=False) as n:
        assert n == 1
    assert shell.execution_count == 1


def test_setting_the_count_in_a_cell_sets_it_kernel_wide() -> None:
    shell = Shell()
    for _ in range(3):
        with cell(shell, store_history=True):
            ipython_cell(shell)
    with cell(shell, store_history=True):
        ipython_cell(shell)
        shell.execution_count = 1  # %reset
    assert shell.execution_count == 1


def test_per_lane_attributes() -> None:
    shell = Shell()
    shell._last_traceback = ["main"]
    assert shell.__dict__["_last_traceback"] == ["main"]  # a plain attribute on the main lane

    def sub() -> Any:
        before = list(shell._last_traceback)
        shell._last_traceback = ["sub"]
        return before, shell._last_traceback

    assert in_subshell_thread(sub) == ([], ["sub"])
    assert shell._last_traceback == ["main"]


def test_input_is_routed_per_context_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanestate, "_real", None)
    monkeypatch.setattr(builtins, "input", lambda prompt="": "real")
    import getpass

    monkeypatch.setattr(getpass, "getpass", lambda prompt="", stream=None: "real-pass")
    barrier = threading.Barrier(2, timeout=10)
    answers: dict[str, str] = {}

    def lane(name: str) -> None:
        current_lane.set(LaneState(name))
        with route_input(lambda prompt="": f"{name}:{prompt}", lambda prompt="", stream=None: "pw"):
            barrier.wait()  # both routes are installed at once
            answers[name] = builtins.input("q")
            barrier.wait()

    threads = [threading.Thread(target=lane, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers == {"a": "a:q", "b": "b:q"}
    assert builtins.input("x") == "real"  # no cell runs: the original input()
    assert getpass.getpass() == "real-pass"
