"""Frames read from the request channels (shell, control, stdin) → Messages.

Runs on: the io run (called by the channel tasks). Bad input is the peer's
fault (errors.ProtocolError): it is counted and dropped, and logged at a
bounded rate, never with the key or the content (badinput.py; messaging spec
"The Wire Protocol"; docs/design.md, "Requests"). What is parsed is bounded
before parsing (wire.WireLimits).
"""

from __future__ import annotations

import logging

from .badinput import BadInputLog
from .errors import ProtocolError
from .heap import HeapTrimmer
from .wire import DEFAULT_LIMITS, Message, Signer, WireLimits, deserialize

log = logging.getLogger("trikernel.inbound")


class InboundParser:
    """Parses and verifies messages for one connection (its ``signer``).

    Call it as ``parse(channel, frames)``: returns the Message, or None
    when the frames were dropped (recorded in ``bad_input``). Not
    thread-safe (the replay guard is shared): io run only.
    """

    def __init__(self, signer: Signer, bad_input: BadInputLog, limits: WireLimits = DEFAULT_LIMITS):
        self._signer = signer
        self.bad_input = bad_input
        self._limits = limits
        self.heap = HeapTrimmer()

    def __call__(self, channel: str, frames: list[bytes]) -> Message | None:
        try:
            msg = deserialize(frames, self._signer, self._limits)
        except ProtocolError as exc:  # deserialize raises nothing else
            self.bad_input.record(channel, exc.kind, str(exc))
            size = sum(len(f) for f in frames)
            frames.clear()  # the caller's list: the frames are freed before the heap is trimmed
            self.heap.dropped(size)
            return None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: received %s %s", channel, msg.msg_type, msg.msg_id)
        return msg
