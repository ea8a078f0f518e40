"""Frames read from the request channels (shell, control, stdin) → Messages.

Runs on: the io run (called by the channel tasks). Bad input is the peer's
fault (errors.ProtocolError): it is counted and dropped, and logged at a
bounded rate, never with the key or the content (badinput.py; messaging spec
"The Wire Protocol"; docs/design.md, "Requests"). What is parsed is bounded
before parsing (wire.WireLimits), and before it is copied: the channel
sockets hand long frames over as views of libzmq's buffer
(sockets.COPY_THRESHOLD), so a JSON frame over ``--max-json-bytes`` is
dropped without ever being copied into a Python object.

This is the one place every incoming message passes, so the two aids for
client authors sit here (docs/conformance.md): with ``--strict`` a message
that parsed is checked against the spec (strict.py) and comes out as a
:class:`~trikernel.strict.Refused` when it departs from it; with
``--message-log`` every message read — served, refused or dropped — is
recorded (messagelog.py). Each is one ``is not None`` test when off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trikernel.errors import ProtocolError
from trikernel.protocol.strict import StrictCheck, log_detail
from trikernel.protocol.wire import DEFAULT_LIMITS, Message, Received, Signer, WireLimits, deserialize
from trikernel.server.heap import HeapTrimmer

if TYPE_CHECKING:
    from trikernel.core.badinput import BadInputLog
    from trikernel.server.messagelog import MessageLog

log = logging.getLogger("trikernel.inbound")


class InboundParser:
    """Parses and verifies messages for one connection (its ``signer``).

    Call it as ``parse(channel, frames)``: returns the Message (a
    ``strict.Refused`` when ``strict`` finds violations), or None when the
    frames were dropped (recorded in ``bad_input``). ``message_log``: where
    every message read is recorded, or None. ``signer``, ``bad_input`` and
    ``message_log`` are public: the stdin bridge signs, records and logs
    with the same ones. Not thread-safe (the replay guard is shared): io
    run only.
    """

    def __init__(
        self,
        signer: Signer,
        bad_input: BadInputLog,
        limits: WireLimits = DEFAULT_LIMITS,
        *,
        strict: StrictCheck | None = None,
        message_log: MessageLog | None = None,
    ):
        self.signer = signer
        self.bad_input = bad_input
        self.message_log = message_log
        self._limits = limits
        self._strict = strict
        self.heap = HeapTrimmer()

    def __call__(self, channel: str, frames: list[Received]) -> Message | None:
        dropped: tuple[str, str] | None = None
        try:
            msg = deserialize(frames, self.signer, self._limits)
        except ProtocolError as exc:  # deserialize raises nothing else
            dropped = (exc.kind, str(exc))
        if dropped is not None:  # past the except: its traceback, which holds the frames, is gone
            kind, detail = dropped
            self.bad_input.record(channel, kind, detail)
            if self.message_log is not None:
                self.message_log.record("in", channel, frames, {"dropped": kind, "detail": detail})
            size = sum(len(f) for f in frames)
            frames.clear()  # the caller's list: the frames are freed before the heap is trimmed
            self.heap.dropped(size)
            return None
        if self._strict is not None:
            msg = self._check(channel, msg, frames)
        elif self.message_log is not None:
            self.message_log.record("in", channel, frames)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: received %s %s", channel, msg.msg_type, msg.msg_id)
        return msg

    def _check(self, channel: str, msg: Message, frames: list[Received]) -> Message:
        """--strict: the message, or a Refused carrying its violations."""
        assert self._strict is not None
        verdict = self._strict(channel, msg)
        if self.message_log is not None:
            note: dict[str, Any] | None = None
            if verdict.violations or verdict.deprecated:
                note = {}
                if verdict.violations:
                    note["violations"] = [str(v) for v in verdict.violations]
                if verdict.deprecated:
                    note["deprecated"] = [str(v) for v in verdict.deprecated]
            self.message_log.record("in", channel, frames, note)
        if not verdict.violations:
            return msg
        self.bad_input.record(channel, "strict", log_detail(msg.msg_type, verdict.violations))
        return StrictCheck.refuse(msg, verdict.violations)
