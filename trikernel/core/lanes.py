"""The shell channel's sequential lanes: the main shell's and one per subshell (JEP 91).

A :class:`SequentialLane` is where the shell requests of one (sub)shell
wait and are served one at a time: its bounded backlog, its stop_on_error
:class:`AbortWindow`, the request it serves and the user run its jobs go
to. :class:`ClientClocks` bounds each client's clock for the window.
:class:`Lanes` is the one list of the subshells that exist (their
threads are the user side's: ``SubshellRuns``).

Runs on: the io run, except :meth:`Lanes.subshell_ids` (any thread).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from trikernel.core.interfaces import UserRunHandle
    from trikernel.protocol.wire import Message

#: Received but not yet started sequential requests, per lane (bounded backlog, messages).
SHELL_BACKLOG = 256
#: Received but not yet handed over concurrent requests (comm messages,
#: comm_info), per lane (bounded backlog, messages); past it the shell
#: reader waits (backpressure).
CONCURRENT_BACKLOG = 256


@dataclass(slots=True)
class Queued:
    """A shell request waiting for its sequential lane.

    ``seq``: its arrival number on the shell channel; ``arrived``:
    ``trio.current_time()`` when it was read (seconds); ``sent``: its header
    ``date`` in POSIX seconds (the client's clock), or None (absent or
    unparsable); ``concurrent_before``: how many of its lane's concurrent
    requests (comm messages) were routed before it (set when it is routed):
    its job is handed over only after theirs (:meth:`SequentialLane.handed_over`).
    """

    msg: Message
    seq: int
    arrived: float
    sent: float | None = None
    concurrent_before: int = 0


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


#: Seconds an observation of a client's clock is trusted (ClientClocks):
#: two clocks that drift apart by 100 ppm move 1 ms apart in that time,
#: less than any client's round trip.
CLOCK_MEMORY = 10.0
#: Client sessions whose clocks are remembered at once (the oldest is forgotten).
CLOCK_SESSIONS = 256


class ClientClocks:
    """For each client session, a bound on its clock against the kernel's.

    A message created at ``date`` on the client's clock, read by the kernel
    at wall time ``now``, gives ``now - date = skew + lag``: the clocks'
    skew plus the time from creating it to reading it, never negative. So
    the least such value seen is an upper bound on the skew, and
    ``date + bound`` is at or after the moment a request was created, on
    the kernel's clock. Every dated message on shell and control counts
    (a ``kernel_info_request`` answered at once gives a tight bound), only
    those of the last CLOCK_MEMORY seconds (clocks drift): two buckets,
    the current one and the one before. Io run only.
    """

    def __init__(self) -> None:
        # session -> [least offset of the current bucket, its start (wall), least of the one before]
        self._sessions: dict[str, list[float]] = {}

    def note(self, session: Any, sent: float, now: float) -> None:
        """A message of ``session`` dated ``sent`` was read at wall time ``now``."""
        if not isinstance(session, str):
            return
        offset = now - sent
        entry = self._sessions.get(session)
        if entry is None:
            self._sessions[session] = [offset, now, math.inf]
            if len(self._sessions) > CLOCK_SESSIONS:
                del self._sessions[next(iter(self._sessions))]  # the oldest session first seen
            return
        age = now - entry[1]
        if age > CLOCK_MEMORY / 2:  # a new bucket; the current one becomes the one before
            entry[:] = [offset, now, entry[0] if age <= CLOCK_MEMORY else math.inf]
        elif offset < entry[0]:
            entry[0] = offset

    def bound(self, session: Any) -> float | None:
        """The least ``now - date`` of ``session``'s recent messages, or None."""
        entry = self._sessions.get(session) if isinstance(session, str) else None
        return min(entry[0], entry[2]) if entry is not None else None


@dataclass
class AbortWindow:
    """Which ``execute_request``\\ s a failed execute with ``stop_on_error`` aborts.

    The rule: those the client made before it could have seen the error
    reply. Exactly decidable only from the kernel's side of the wire, so
    three parts, each sound (it never aborts a request made after the
    client received the reply):

    1. while the error reply has not left the kernel (it may wait behind
       the request's IOPub output: iopubqueue.Ordered), every request read
       is covered: it was sent before the client could see anything;
    2. once it left (:meth:`reply_left`, at wall time ``left_at``, taken
       right before the send), every request read by then (``upto_seq``;
       the shell socket is drained right after the send, so what libzmq had
       delivered counts) — except the failed session's requests whose
       ``date`` plus its clock bound is at or after ``left_at``: on a loaded
       machine the drain can come late enough to read a request the client
       made after it got the reply, and that one must run;
    3. a request of the failed request's client session whose ``date`` plus
       the session's clock bound (ClientClocks) is before ``left_at``: it
       was made before the reply left, however late it arrives (a client
       that made its Run All requests first and was descheduled while
       sending them). The first request of that session not covered ends
       this part.

    Limit: a client that makes each request only as it sends it, and is
    descheduled for longer than the kernel takes to fail the first one,
    makes the rest of its burst after the reply left; nothing on the wire
    tells that from a client that waited for the reply, so they run
    (docs/design.md, "Requests").
    """

    active: bool = False
    upto_seq: int = -1
    session: str | None = None
    left_at: float | None = None  # wall time (time.time()) right before the error reply's send
    failed_session: str | None = None  # the failed request's client session
    session_ran: bool = False  # a request of that session made after the reply left was let run

    def covers(self, q: Queued, clocks: ClientClocks) -> bool:
        """Whether ``q`` is aborted (only ``execute_request`` ever is)."""
        if not self.active or q.msg.msg_type != "execute_request":
            return False
        if self.left_at is None:
            return True
        if self.session is not None and q.msg.header.get("session") == self.session:
            bound = clocks.bound(self.session)
            if q.sent is not None and bound is not None:
                if q.sent + bound < self.left_at:
                    return True  # made before the reply left, however late it was read
                self.session = None  # made after it: this one runs, and the session's later ones
                self.session_ran = True
                return False
        if self.session_ran and q.msg.header.get("session") == self.failed_session:
            return False
        return q.seq <= self.upto_seq

    @classmethod
    def after(cls, failed: Queued) -> AbortWindow:
        """The window a failure of ``failed`` opens (before its reply leaves)."""
        session = failed.msg.header.get("session")
        mine = session if isinstance(session, str) else None
        return cls(active=True, session=mine, failed_session=mine)

    def reply_left(self, upto_seq: int, wall: float) -> None:
        """The error reply left at wall time ``wall``, with every request up
        to ``upto_seq`` read."""
        self.upto_seq = upto_seq
        self.left_at = wall


@dataclass(eq=False)
class SequentialLane:
    """One sequential lane of the shell channel: the main shell's
    (``subshell_id`` None) or a subshell's.

    ``send``/``recv``: its backlog (SHELL_BACKLOG); ``concurrent_send`` /
    ``concurrent_recv``: its concurrent requests (comm messages,
    comm_info), handed to its user run one by one in arrival order
    (CONCURRENT_BACKLOG), so a widget's messages reach ``on_msg`` in the
    order the frontend sent them; ``user_run``: where its jobs run;
    ``ready``: set once that run takes jobs; ``abort``: its stop_on_error
    window (per subshell, as ipykernel); ``current``: the request being
    served; ``deleted``: delete_subshell_request came — the queued requests
    are answered without running and the lane ends.

    Order across the two backlogs: a sequential request's job reaches the
    user run after the jobs of the concurrent requests that came before it
    on the shell channel (``concurrent_routed`` counts those routed,
    ``concurrent_handed`` those whose job was handed over or that ended
    without one), so a cell sees every comm message the frontend sent
    before it (ipykernel: one shell queue). The user run then runs them in
    that order (``UserRunHandle.start_job_soon``).
    """

    subshell_id: str | None
    user_run: UserRunHandle
    ready: trio.Event
    send: trio.MemorySendChannel[Queued]
    recv: trio.MemoryReceiveChannel[Queued]
    concurrent_send: trio.MemorySendChannel[Message]
    concurrent_recv: trio.MemoryReceiveChannel[Message]
    abort: AbortWindow = field(default_factory=AbortWindow)
    current: Queued | None = None
    deleted: bool = False
    concurrent_routed: int = 0
    concurrent_handed: int = 0
    _progress: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def one_handed_over(self) -> None:
        """The oldest concurrent request not yet counted has its job in the
        user run's hands, or ended without one (io run)."""
        self.concurrent_handed += 1
        self._progress.unpark_all()

    async def handed_over(self, routed: int) -> None:
        """Return once the first ``routed`` concurrent requests are handed over (io run).

        Cancellation: a checkpoint only while it waits."""
        while self.concurrent_handed < routed:
            await self._progress.park()

    @classmethod
    def open(cls, subshell_id: str | None, user_run: UserRunHandle, ready: trio.Event) -> SequentialLane:
        """A lane with an empty backlog (io run)."""
        send, recv = trio.open_memory_channel[Queued](SHELL_BACKLOG)
        concurrent_send, concurrent_recv = trio.open_memory_channel["Message"](CONCURRENT_BACKLOG)
        return cls(subshell_id, user_run, ready, send, recv, concurrent_send, concurrent_recv)

    @property
    def idle(self) -> bool:
        """Nothing served and nothing queued."""
        return self.current is None and self.send.statistics().current_buffer_used == 0


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
        """Unlist a subshell's lane and mark it deleted (its tasks end after
        its backlogs, then its run is stopped); None if unknown."""
        lane = self._subshells.pop(subshell_id, None)
        self._ids = tuple(self._subshells)
        if lane is not None:
            lane.deleted = True
            lane.send.close()
            lane.concurrent_send.close()
        return lane

    def subshell_ids(self) -> list[str]:
        """The subshells' ids in creation order (any thread: ``%subshell``)."""
        return list(self._ids)
