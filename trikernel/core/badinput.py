"""Bad input from peers: counted always, logged at a bounded rate.

Principle 4 (bad input is the peer's fault, not a crash) and principle 2
(what is dropped is counted and visible): every message a peer sent that
the kernel drops or refuses — bad signature, invalid JSON, too deep, an
unknown msg_type, comm content of the wrong shape, a subscription frame
that is none — goes through :meth:`BadInputLog.record` with the channel it
came in on and a short *kind* (``ProtocolError.kind``).

Logging is bounded whatever the peer does: when nothing was logged for
``interval`` seconds, the record is logged at once with its detail (so a
single bad message is logged as it happens, as before); every record
after that, until the interval has passed, is only counted, and
:meth:`BadInputLog.run` (a task of the io run) logs one summary line per
interval with the counts per channel and kind and the last detail. A
client stuck in a loop sending garbage costs one line per interval, not
one per message (docs/robustness.md has the figures).

Details never hold the HMAC key, CurveZMQ keys or message content: the
callers pass what was wrong (``"bad message signature"``), and peer
strings such as an unknown msg_type are cut to :data:`DETAIL_CHARS` with
``repr`` (one line, no control characters).

Threads: :meth:`record` may be called from any thread (a lock guards the
counters); :meth:`run` runs in the io run; :meth:`statistics` may be read
from any thread (``%trikernel`` reads it on the main thread).

Runs on: any thread for :meth:`BadInputLog.record` and ``statistics`` (a
lock guards the counters); the io run for :meth:`BadInputLog.run`, the
summary task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("trikernel.badinput")

#: Seconds between two summary lines (default of ``--bad-input-log-interval``).
DEFAULT_INTERVAL = 10.0
#: Longest peer-controlled text (repr) put into a log line, in characters.
DETAIL_CHARS = 80


def short(value: object) -> str:
    """``repr(value)`` cut to :data:`DETAIL_CHARS`: safe to log (one line)."""
    text = repr(value)
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class BadInputStats:
    """What :meth:`BadInputLog.statistics` returns.

    - ``dropped``: messages (or subscription frames) dropped or refused
      since start-up, all channels and kinds.
    - ``by_kind``: ``{"<channel>.<kind>": count}``.
    - ``log_lines``: lines this log wrote (detail and summary lines).
    """

    dropped: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    log_lines: int = 0


class BadInputLog:
    """Counts bad input per channel and kind; logs it at a bounded rate.

    Args:
        interval: seconds between summary lines (> 0).
        logger: where lines go (default ``trikernel.badinput``).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._log = logger or log
        self._clock = clock
        self._lock = threading.Lock()
        self._total: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()  # counted since the last line
        self._last_detail = ""
        self._last_line = -float("inf")
        self._lines = 0

    def record(self, channel: str, kind: str, detail: str) -> None:
        """Count one dropped/refused input; log it now if the log was quiet.

        ``channel``: shell, control, stdin, iopub, hb or handshake.
        ``kind``: a short identifier (``ProtocolError.kind``).
        ``detail``: what was wrong, without secrets or content.
        """
        key = f"{channel}.{kind}"
        with self._lock:
            self._total[key] += 1
            now = self._clock()
            if now - self._last_line >= self.interval and not self._pending:
                self._last_line = now
                self._lines += 1
                line = True
            else:
                self._pending[key] += 1
                self._last_detail = f"{channel}: {detail}"
                line = False
        if line:
            self._log.warning(
                "%s: dropped bad input (%s): %s; more bad input is summarised every %gs",
                channel,
                kind,
                detail,
                self.interval,
            )

    def flush(self) -> None:
        """Log one summary line now if anything was counted since the last."""
        with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, Counter()
            last = self._last_detail
            self._last_line = self._clock()
            self._lines += 1
        counts = ", ".join(f"{k} {n}" for k, n in sorted(pending.items()))
        self._log.warning(
            "dropped %d more bad inputs (%s); last: %s; %d since start-up",
            sum(pending.values()),
            counts,
            last,
            self.statistics().dropped,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """io run task: a summary line every ``interval`` while bad input comes.

        A timer: no event says "an interval has passed" (principle 3).
        Flushes once more when cancelled (shutdown), so no count is lost
        from the log.
        """
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval)
                self.flush()
        finally:
            self.flush()

    def statistics(self) -> BadInputStats:
        """Counters since start-up (a snapshot; any thread)."""
        with self._lock:
            return BadInputStats(sum(self._total.values()), dict(self._total), self._lines)
