"""The every-message audit: each message the kernel sends, checked as it arrives.

:class:`Audit` sees every message any :class:`~.client.Channels` receives,
over the whole run (kernel restarts included), and keeps one
:class:`Tally` per category: the count checked, the count that departed and
the first few departures as text. The ``messages.*`` checks report them.

Categories (spec sections in :data:`SECTIONS`):

- ``header``: the envelope: header fields present and strings, the four
  parts JSON objects, frames that parse (``trikernel.msgspec``);
- ``msg_id``: unique per message (a copy that reaches a second IOPub
  subscriber is the same message, not a duplicate);
- ``date``: ISO 8601; ``version``: a ``5.x`` protocol version;
- ``signature``: the HMAC of the four frames, with the connection key;
- ``content``: content per msg_type, on the right channel;
- ``parent``: a reply's ``parent_header`` is a copy of its request's
  header and its type is the request's ``*_reply``.

Keeps O(1) memory per message (a msg_id set) and no message bodies.
Caller's thread only.

Runs on: the client side, the suite's thread only (``Channels`` calls it
for each message it receives).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trikernel.conformance.received import Received

CATEGORIES = ("header", "msg_id", "date", "version", "signature", "content", "parent")
SECTIONS = {
    "header": msgspec.SEC_HEADER + "; " + msgspec.SEC_FORMAT,
    "msg_id": msgspec.SEC_HEADER + " (msg_id: must be unique per message)",
    "date": msgspec.SEC_HEADER + " (date: ISO 8601, mandatory since 5.1)",
    "version": msgspec.SEC_HEADER + " (version, since 5.0)",
    "signature": "messaging § The Wire Protocol (HMAC signature)",
    "content": "messaging § each message type's section (msgspec_v5 schemas, corrected)",
    "parent": msgspec.SEC_PARENT + " (_reply messages MUST have a parent_header)",
}
EXAMPLES = 3


@dataclass
class Tally:
    """One category: ``checked`` messages, ``bad`` departures, a few ``examples``."""

    checked: int = 0
    bad: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str) -> None:
        """Count one departure in this category and keep ``example`` (one line of text naming the
        message and what was wrong) if fewer than :data:`EXAMPLES` are kept. ``checked`` is
        the caller's to count."""
        self.bad += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def header_copy_problems(parent: Mapping[str, Any], request: Mapping[str, Any]) -> list[str]:
    """How ``parent`` differs from the ``request`` header it should copy
    (dates compared as instants: a kernel may re-serialise them)."""
    out = []
    for key, want in request.items():
        if key not in parent:
            out.append(f"parent_header.{key} missing")
            continue
        got = parent[key]
        if key == "date" and got != want:
            if _when(got) is None or _when(got) != _when(want):
                out.append(f"parent_header.date {got!r} != request's {want!r}")
        elif got != want:
            out.append(f"parent_header.{key} {got!r:.60} != request's {want!r:.60}")
    return out


class Audit:
    """Checks every message as it arrives; see the module docstring."""

    def __init__(self) -> None:
        self.tallies = {c: Tally() for c in CATEGORIES}
        self.types: Counter[str] = Counter()
        self._ids: dict[str, tuple[str, str]] = {}

    def frames_error(self, socket: str, why: str) -> None:
        """A multipart message from the kernel that is not a Jupyter message."""
        t = self.tallies["header"]
        t.checked += 1
        t.add(f"{socket}: {why}")

    def see(self, msg: Received, request: Mapping[str, Any] | None) -> None:
        """Audit one message. ``request``: the header we sent that its
        parent names (None if we sent none; only looked up for messages on
        shell, control and stdin)."""
        self.types[msg.msg_type] += 1
        t = self.tallies
        where = f"{msg.msg_type or '?'} on {msg.socket}"
        for cat in ("header", "msg_id", "date", "version", "signature", "content"):
            t[cat].checked += 1
        first: dict[str, str] = {}  # one departure counted per message and category
        for v in msgspec.validate_message(msg.as_dict(), channel=msg.channel, sender="kernel"):  # type: ignore[arg-type]
            first.setdefault(self._category(v), f"{where}: {v}")
        for cat, example in first.items():
            t[cat].add(example)
        if not msg.signature_ok:
            t["signature"].add(f"{where}: HMAC does not match the connection key")
        self._unique(msg, where)
        if msg.channel in ("shell", "control") or msg.msg_type == "input_request":
            self._parent(msg, request, where)

    @staticmethod
    def _category(v: msgspec.Violation) -> str:
        f = v.field
        if f.endswith(".date") and f.count(".") == 1:
            return "date"
        if f.endswith(".version") and f.count(".") == 1:
            return "version"
        if f == "header.msg_type" and ("on " in v.expected or "sends" in v.expected or "deprecated" in v.expected):
            return "content"
        if f.startswith(("header", "parent_header")) or f in ("metadata", "content", "buffers", "message"):
            return "header"  # the envelope: header fields, and the four parts being objects
        return "content"

    def _unique(self, msg: Received, where: str) -> None:
        mid = msg.msg_id
        if not mid:
            return
        prior = self._ids.get(mid)
        if prior is None:
            self._ids[mid] = (msg.channel, msg.socket)
            return
        channel, socket = prior
        if channel == "iopub" == msg.channel and socket != msg.socket:
            return  # one IOPub message, seen by two subscribers
        self.tallies["msg_id"].add(f"{where}: msg_id {mid!r} already used by a message on {socket}")

    def _parent(self, msg: Received, request: Mapping[str, Any] | None, where: str) -> None:
        t = self.tallies["parent"]
        t.checked += 1
        parent = msg.parent_header
        if not parent:
            t.add(f"{where}: empty parent_header")
            return
        if request is None:
            t.add(f"{where}: parent msg_id {msg.parent_id!r:.40} is no request this client sent")
            return
        problems = header_copy_problems(parent, request)
        req_type = str(request.get("msg_type", ""))
        if (
            msg.channel != "stdin"
            and req_type.endswith("_request")
            and msg.msg_type != req_type[: -len("request")] + "reply"
        ):
            problems.append(f"a {msg.msg_type} answers a {req_type}")
        if problems:
            t.add(f"{where}: " + "; ".join(problems))
