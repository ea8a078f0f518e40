"""Routing terms: lanes, routes, handlers, and what a handler sees of the core.

Every ``msg_type`` the kernel serves has one :class:`Route` in the table
(table.py, as xeus's ``xkernel_core`` and ipykernel's ``shell_handlers``):
the channels it is accepted on, its :class:`Lane` and its handler. Lanes:

- ``io``: answered in the io run itself, in arrival order on its channel
  (kernel_info, connect, shutdown, interrupt, usage, subshells), so control answers
  while a cell runs and kernel_info while IPython is still loading;
- ``sequential``: one at a time, in order, per shell lane, in its user run's
  main task (execute, complete, inspect, is_complete, history);
- ``concurrent``: as tasks of the lane's user run as soon as it has control
  (comm messages, comm_info), so a widget's ``on_msg`` runs while an async
  cell awaits;
- ``debug``: ``debug_request`` on control, one at a time in arrival order
  in an io-run task of its own, so each gets busy, reply, idle before the
  next one's busy, and one that waits on debugpy never holds up kernel_info
  or interrupt.

A handler is ``async handler(core, ctx) -> Reply | None``: ``core`` is the
:class:`CoreServices` of the kernel core (kernelcore.py), ``ctx`` the
request's :class:`~trikernel.core.context.RequestContext`.

Runs on: the io run.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trikernel.core.badinput import BadInputLog
    from trikernel.core.context import Reply, RequestContext
    from trikernel.core.interfaces import Interpreter, SubshellRun, SubshellRuns, UserRunHandle
    from trikernel.core.lanes import Lanes, Queued, SequentialLane
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Message


class Lane(StrEnum):
    """Where a request is served (module docstring)."""

    IO = "io"
    SEQUENTIAL = "sequential"
    CONCURRENT = "concurrent"
    DEBUG = "debug"


class CoreServices(Protocol):
    """What a handler may use of the kernel core (kernelcore.KernelCore). Runs on: the io run."""

    @property
    def builder(self) -> MessageBuilder:
        """Builds the kernel's messages."""

    @property
    def lanes(self) -> Lanes:
        """The shell channel's sequential lanes."""

    @property
    def main_run(self) -> UserRunHandle:
        """The main thread's user run."""

    @property
    def subshells(self) -> SubshellRuns | None:
        """The subshells' threads, or None when subshells are not offered."""

    @property
    def bad_input(self) -> BadInputLog:
        """Counts and logs what peers got wrong."""

    def kernel_info(self) -> dict[str, Any]:
        """``kernel_info_reply`` content."""

    def request_shutdown(self) -> None:
        """Begin an orderly shutdown (once idle is queued)."""

    def ports(self) -> dict[str, int]:
        """The kernel's bound ports, ``{"shell_port": n, ...}`` (five channels)."""

    def serving(self) -> SequentialLane | None:
        """The lane the current io-run task serves (None outside the lanes)."""

    async def interpreter(self) -> Interpreter:
        """The interpreter, once the user side is up (waits for it)."""

    async def run_job(
        self, fn: Callable[[], Awaitable[Any]], *, concurrent: bool = False, context: RequestContext | None = None
    ) -> Any:
        """Run ``fn`` in the serving lane's user run; returns its result.
        Raises JobInterrupted, KernelShuttingDown, or what the job raised."""

    def start_abort(self, lane: SequentialLane, failed: Queued) -> Callable[[float], None]:
        """stop_on_error: open ``lane``'s abort window for ``failed``; returns
        what to call once its error reply has left (``Reply.on_sent``)."""

    def open_lane(self, run: SubshellRun) -> SequentialLane:
        """List and start serving a new subshell's lane."""

    async def publish(self, msg: Message) -> None:
        """Queue an IOPub message (io run)."""

    async def debug(self, request: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any] | None:
        """The DAP response to a ``debug_request``, or None without a debugger."""


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the dispatch table: ``channels`` it is accepted on, its
    ``lane`` and its ``handler`` (``async handler(core, ctx)``)."""

    channels: frozenset[str]
    lane: Lane
    handler: Callable[[CoreServices, RequestContext], Awaitable[Reply | None]]


SHELL = frozenset({"shell"})
CONTROL = frozenset({"control"})
BOTH = frozenset({"shell", "control"})
