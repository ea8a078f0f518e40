"""One message the conformance suite received from the kernel under test.

Runs on: the suite's thread (client side).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Received:
    """One message from the kernel, as it arrived.

    ``socket``: the label of the receiving socket (``shell``, ``iopub``,
    ``iopub:late``...); ``channel``: its channel; ``seq``: arrival order
    over all sockets; ``arrival``: ``time.monotonic()`` seconds.
    """

    socket: str
    channel: str
    seq: int
    arrival: float
    idents: list[bytes]
    header: dict[str, Any]
    parent_header: dict[str, Any]
    metadata: dict[str, Any]
    content: dict[str, Any]
    buffers: list[bytes] = field(default_factory=list)
    signature_ok: bool = True
    #: The four parts as decoded, when one of them was not a JSON object
    #: (the fields above then hold ``{}`` in its place).
    raw: tuple[Any, ...] | None = None

    @property
    def msg_type(self) -> str:
        """The header's ``msg_type``; ``""`` when it has none."""
        return str(self.header.get("msg_type", ""))

    @property
    def msg_id(self) -> str:
        """The header's ``msg_id``; ``""`` when it has none."""
        return str(self.header.get("msg_id", ""))

    @property
    def parent_id(self) -> str:
        """The parent header's ``msg_id`` (the request this message answers or belongs to);
        ``""`` for a message with no parent (e.g. ``iopub_welcome``)."""
        return str(self.parent_header.get("msg_id", "")) if isinstance(self.parent_header, dict) else ""

    def as_dict(self) -> dict[str, Any]:
        """The message as the kernel sent it (for trikernel.msgspec)."""
        if self.raw is not None:
            header, parent, metadata, content = self.raw
            return {
                "header": header,
                "parent_header": parent,
                "metadata": metadata,
                "content": content,
                "buffers": self.buffers,
            }
        return {
            "header": self.header,
            "parent_header": self.parent_header,
            "metadata": self.metadata,
            "content": self.content,
            "buffers": self.buffers,
        }

    def __repr__(self) -> str:
        return f"<{self.socket} {self.msg_type} {self.content!r:.80}>"
