"""IPython state kept apart per shell lane (the main shell, each subshell).

Runs on: every user thread. The main shell and every subshell (JEP 91,
subshells.py) run their cells through the one IPython shell, so they share
the user namespace, the history database and the execution counter, as in
ipykernel. What belongs to one running cell must not leak into a cell that
runs at the same time on another thread: this module keeps that state per
*lane* — the value of :data:`current_lane`, a context variable that a
subshell's thread sets before its trio run starts (trio copies it into every
task of that run); the main shell's lane is the default, so threads users
start count as the main shell's.

Per lane:

- the running cell's view of ``execution_count`` (:class:`ExecutionCount`):
  a cell takes its number when it starts (:func:`cell`), so two cells that
  overlap never share one, and reads inside the cell (``Out[n]``, the reply's
  ``execution_count``) see that cell's number, not whichever cell started
  last;
- attributes that IPython and trikernel treat as "the current cell's"
  (:class:`PerLane`: ``_last_traceback``, the payload manager);
- where ``input()`` and ``getpass()`` go (:func:`route_input`): the stdin
  request of the cell running in this context (JEP 91: stdin per subshell).

On the main lane a :class:`PerLane` attribute is a plain instance attribute,
so the main shell behaves as before.
"""

from __future__ import annotations

import builtins
import getpass
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class LaneState:
    """What one lane keeps apart. ``subshell_id`` is None for the main shell."""

    __slots__ = ("cell_count", "reserved", "subshell_id", "values")

    def __init__(self, subshell_id: str | None = None):
        self.subshell_id = subshell_id
        self.cell_count: int | None = None  # the running cell's view of execution_count
        self.reserved: int | None = None  # the number the running cell took
        self.values: dict[str, Any] = {}  # PerLane attributes of a subshell lane


MAIN_LANE = LaneState()

#: The lane whose code runs in this context (the main shell's by default).
current_lane: ContextVar[LaneState] = ContextVar("trikernel_lane", default=MAIN_LANE)

_count_lock = threading.Lock()


class PerLane:
    """A data descriptor: a plain attribute on the main lane, one value per
    subshell lane elsewhere (made by ``factory()`` on first read)."""

    def __init__(self, factory: Callable[[Any], Any]):
        self._factory = factory
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        lane = current_lane.get()
        store = obj.__dict__ if lane is MAIN_LANE else lane.values
        try:
            return store[self._name]
        except KeyError:
            value = store[self._name] = self._factory(obj)
            return value

    def __set__(self, obj: Any, value: Any) -> None:
        lane = current_lane.get()
        (obj.__dict__ if lane is MAIN_LANE else lane.values)[self._name] = value


class ExecutionCount:
    """``InteractiveShell.execution_count`` shared by all lanes, seen per cell.

    Outside a cell: the kernel-wide count, the number the next stored cell
    gets. Inside a cell (between :func:`cell`'s start and end): that cell's
    own view — its number until IPython increments it, then number + 1 —
    whatever cells on other lanes do meanwhile. Setting it to anything but
    the view + 1 (``%reset`` sets 1) sets the kernel-wide count too.
    """

    _key = "_trikernel_execution_count"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        view = current_lane.get().cell_count
        return view if view is not None else obj.__dict__.get(self._key, 1)

    def __set__(self, obj: Any, value: int) -> None:
        lane = current_lane.get()
        with _count_lock:
            if lane.cell_count is not None and value == lane.cell_count + 1 and lane.reserved == lane.cell_count:
                lane.cell_count = value  # IPython's own increment: the number was taken at the start
                return
            obj.__dict__[self._key] = value
            if lane.cell_count is not None:
                lane.cell_count = value


@contextmanager
def cell(shell: Any, store_history: bool) -> Iterator[int]:
    """Run one execute request's cell on the current lane; yields its number.

    With ``store_history`` the cell takes the kernel-wide count at once (so a
    cell starting meanwhile on another lane takes the next one); IPython's
    increment inside the cell then changes only this cell's view. A cell that
    stores nothing (silent, or empty) gives its number back if no other cell
    took one since. Call on the lane's own thread, around the whole request.
    """
    lane = current_lane.get()
    with _count_lock:
        number = shell.__dict__.get(ExecutionCount._key, 1)
        if store_history:
            shell.__dict__[ExecutionCount._key] = number + 1
            lane.reserved = number
        lane.cell_count = number
    try:
        yield number
    finally:
        with _count_lock:
            if store_history and lane.cell_count == number and shell.__dict__.get(ExecutionCount._key) == number + 1:
                shell.__dict__[ExecutionCount._key] = number  # IPython skipped it (an empty cell)
            lane.cell_count = None
            lane.reserved = None


# -- input() and getpass() ------------------------------------------------------

_input_route: ContextVar[tuple[Callable[..., str], Callable[..., str]] | None] = ContextVar(
    "trikernel_input", default=None
)
_fallback: list[tuple[Callable[..., str], Callable[..., str]]] = []  # routes of running cells, latest last
_real: tuple[Callable[..., str], Callable[..., str]] | None = None


def _routed_input(prompt: object = "") -> str:
    return _route()[0](prompt)


def _routed_getpass(prompt: str = "Password: ", stream: Any = None) -> str:
    return _route()[1](prompt, stream)


def _route() -> tuple[Callable[..., str], Callable[..., str]]:
    route = _input_route.get()
    if route is not None:
        return route
    if _fallback:  # a thread a cell started: the latest running cell's, as a global swap would give
        return _fallback[-1]
    assert _real is not None
    return _real


@contextmanager
def route_input(input_fn: Callable[..., str], getpass_fn: Callable[..., str]) -> Iterator[None]:
    """Send ``input()`` / ``getpass.getpass()`` called in this context (and in
    threads with no route of their own) to these functions while the block
    runs. Installs the routing functions into :mod:`builtins` and
    :mod:`getpass` on first use; they are never swapped again, so cells
    running at once on different lanes each keep their own stdin.
    """
    global _real
    if _real is None:
        _real = (builtins.input, getpass.getpass)
        builtins.input = _routed_input
        getpass.getpass = _routed_getpass
    route = (input_fn, getpass_fn)
    token = _input_route.set(route)
    _fallback.append(route)
    try:
        yield
    finally:
        _input_route.reset(token)
        _fallback.remove(route)
