"""Frames read from the request channels (shell, control, stdin) → Messages.

Runs on: the io run (called by the channel tasks). Bad input is the peer's
fault (errors.ProtocolError): it is logged — never with the key or the
content — and dropped, and the kernel keeps serving (messaging spec "The
Wire Protocol"; docs/design.md, "Requests").
"""

from __future__ import annotations

import logging

from .errors import ProtocolError
from .wire import Message, Signer, deserialize

log = logging.getLogger("trikernel.inbound")


class InboundParser:
    """Parses and verifies messages for one connection (its ``signer``).

    Call it as ``parse(channel, frames)``: returns the Message, or None
    when the frames were dropped. Not thread-safe (the replay guard is
    shared): io run only.
    """

    def __init__(self, signer: Signer):
        self._signer = signer
        self.dropped = 0  #: messages dropped as malformed, unsigned, badly signed or replayed

    def __call__(self, channel: str, frames: list[bytes]) -> Message | None:
        try:
            msg = deserialize(frames, self._signer)
        except ProtocolError as exc:
            self.dropped += 1
            log.warning("%s: dropped a bad message: %s", channel, exc)
            return None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: received %s %s", channel, msg.msg_type, msg.msg_id)
        return msg
