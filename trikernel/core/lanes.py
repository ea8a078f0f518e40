"""The shell channel's sequential lanes: the main shell's and one per subshell (JEP 91).

A :class:`SequentialLane` is where the shell requests of one (sub)shell
wait and are served one at a time: its bounded backlog, its stop_on_error
:class:`AbortWindow`, the request it serves and the user run its jobs go
to. :class:`Lanes` is the one list of the subshells that exist (their
threads are the user side's: ``SubshellRuns``).

Runs on: the io run, except :meth:`Lanes.subshell_ids` (any thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from trikernel.core.interfaces import UserRunHandle
    from trikernel.protocol.wire import Message

#: Received but not yet started sequential requests, per lane (bounded backlog, messages).
SHELL_BACKLOG = 256


@dataclass(slots=True)
class Queued:
    """A shell request waiting for its sequential lane.

    ``seq``: its arrival number on the shell channel; ``arrived``:
    ``trio.current_time()`` when it was read (seconds).
    """

    msg: Message
    seq: int
    arrived: float


def posix_time(date: Any) -> float | None:
    """POSIX seconds of an ISO 8601 header ``date`` (naive = UTC), or None."""
    if not isinstance(date, str):
        return None
    try:
        dt = datetime.fromisoformat(date)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass
class AbortWindow:
    """Which ``execute_request``\\ s a failed execute with ``stop_on_error`` aborts.

    Exactly those sent before the failure (the client could not have seen
    the error yet). Two rules, either is enough:

    1. it had arrived when the failure was decided (``upto_seq``): the shell
       socket is drained at that moment, so everything already delivered
       by libzmq counts;
    2. it comes from the failed request's client session and its header
       ``date`` is earlier than ``sent_before``: the failed request's own
       ``date`` plus the time the kernel spent on it, both on the client's
       clock, so clock skew between client and kernel does not matter. The
       first later-dated request of that session ends this rule.

    Requests sent after the error reply was received are never aborted.
    """

    upto_seq: int = -1
    session: str | None = None
    sent_before: float | None = None  # POSIX seconds on the client's clock

    def covers(self, q: Queued) -> bool:
        """Whether ``q`` is aborted (only ``execute_request`` ever is)."""
        if q.msg.msg_type != "execute_request":
            return False
        if q.seq <= self.upto_seq:
            return True
        if self.session is not None and q.msg.header.get("session") == self.session:
            sent = posix_time(q.msg.header.get("date"))
            if sent is not None and self.sent_before is not None and sent <= self.sent_before:
                return True
            self.session = None
        return False

    @classmethod
    def after(cls, failed: Queued, upto_seq: int, now: float) -> AbortWindow:
        """The window a failure of ``failed`` opens, decided at ``now``
        (``trio.current_time()``) with every request up to ``upto_seq`` read."""
        sent = posix_time(failed.msg.header.get("date"))
        spent = now - failed.arrived
        return cls(
            upto_seq=upto_seq,
            session=failed.msg.header.get("session") if sent is not None else None,
            sent_before=sent + spent if sent is not None else None,
        )


@dataclass(eq=False)
class SequentialLane:
    """One sequential lane of the shell channel: the main shell's
    (``subshell_id`` None) or a subshell's.

    ``send``/``recv``: its backlog (SHELL_BACKLOG); ``user_run``: where its
    jobs run; ``ready``: set once that run takes jobs; ``abort``: its
    stop_on_error window (per subshell, as ipykernel); ``current``: the
    request being served; ``deleted``: delete_subshell_request came — the
    queued requests are answered without running and the lane ends.
    """

    subshell_id: str | None
    user_run: UserRunHandle
    ready: trio.Event
    send: trio.MemorySendChannel[Queued]
    recv: trio.MemoryReceiveChannel[Queued]
    abort: AbortWindow = field(default_factory=AbortWindow)
    current: Queued | None = None
    deleted: bool = False

    @classmethod
    def open(cls, subshell_id: str | None, user_run: UserRunHandle, ready: trio.Event) -> SequentialLane:
        """A lane with an empty backlog (io run)."""
        send, recv = trio.open_memory_channel[Queued](SHELL_BACKLOG)
        return cls(subshell_id, user_run, ready, send, recv)

    @property
    def idle(self) -> bool:
        """Nothing served and nothing queued."""
        return self.current is None and self.send.statistics().current_buffer_used == 0

    @property
    def full(self) -> bool:
        """The backlog holds SHELL_BACKLOG requests."""
        return self.send.statistics().current_buffer_used >= SHELL_BACKLOG


class Lanes:
    """The main lane and the subshells' lanes, in creation order: the one
    list of the subshells that exist (JEP 91 ``list_subshell``)."""

    def __init__(self, main: SequentialLane):
        self.main = main
        self._subshells: dict[str, SequentialLane] = {}
        self._ids: tuple[str, ...] = ()  # a snapshot other threads may read

    def of(self, msg: Message) -> SequentialLane | None:
        """The lane ``msg`` goes to: by ``header.subshell_id`` (JEP 91), the
        main shell's when absent or null; None for an unknown id."""
        subshell_id = msg.header.get("subshell_id")
        if subshell_id is None:
            return self.main
        return self._subshells.get(subshell_id) if isinstance(subshell_id, str) else None

    def get(self, subshell_id: object) -> SequentialLane | None:
        """A subshell's lane by id, or None."""
        return self._subshells.get(subshell_id) if isinstance(subshell_id, str) else None

    def add(self, lane: SequentialLane) -> None:
        """List a new subshell's lane."""
        assert lane.subshell_id is not None
        self._subshells[lane.subshell_id] = lane
        self._ids = tuple(self._subshells)

    def remove(self, subshell_id: str) -> SequentialLane | None:
        """Unlist a subshell's lane and mark it deleted (its task ends after
        its backlog, then stops its run); None if unknown."""
        lane = self._subshells.pop(subshell_id, None)
        self._ids = tuple(self._subshells)
        if lane is not None:
            lane.deleted = True
            lane.send.close()
        return lane

    def any_full(self) -> bool:
        """Some lane's backlog is full."""
        return self.main.full or any(lane.full for lane in self._subshells.values())

    def subshell_ids(self) -> list[str]:
        """The subshells' ids in creation order (any thread: ``%subshell``)."""
        return list(self._ids)
