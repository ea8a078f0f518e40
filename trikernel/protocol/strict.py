"""``--strict``: every incoming message is checked against the messaging spec.

For client and frontend authors (issue 14, docs/conformance.md). With
``--strict`` the :class:`~trikernel.inbound.InboundParser` — the one place
frames from shell, control and stdin become messages — calls
:class:`StrictCheck` on every message that parsed and is correctly signed.
A message with violations comes out of the parser as a :class:`Refused`
(a :class:`~trikernel.wire.Message` that carries them) and is answered,
never run:

- a ``*_request`` on shell or control gets its ``*_reply`` with
  ``status: error``, ``ename: ProtocolError`` and an ``evalue`` that names
  each field, what the spec expects there and the spec section, inside the
  usual busy/idle (core/kernelcore.py, route ``REFUSED``, io lane: answered at
  once, ahead of requests queued for the sequential lane);
- where the spec defines no reply (``comm_open`` / ``comm_msg`` /
  ``comm_close``, any other non-request on shell or control, and
  ``input_reply`` on stdin) the kernel publishes an IOPub ``error`` with
  the refused message as parent. A refused ``input_reply`` does not answer
  the pending ``input()``: it keeps waiting for a conforming reply (or an
  interrupt).

What is checked is :func:`trikernel.msgspec.validate_message` with the
channel and ``sender="client"``: header fields and types, ``date``,
``version`` (5.x), ``subshell_id``; content per ``msg_type``; the type is
one a client sends, on a channel that takes it. Deprecated but defined
forms (``shutdown_request`` on shell) are served; the message log notes
them. Unknown message types are not violations (spec "Compatibility"):
they get today's ``UnknownMessageType`` reply.

msgspec needs jupyter_kernel_test and jsonschema (the ``conformance``
extra); :func:`load` imports them only when ``--strict`` is given and stops
start-up with one line when they are missing. Without ``--strict`` nothing
here runs and nothing changes.

Runs on: the io run (the parser calls the check; the answers are sent by
the channel tasks). :class:`StrictCheck` holds no state and may be called
from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trikernel.errors import ConfigError
from trikernel.protocol.wire import Message

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from trikernel.protocol.msgspec import Violation

#: ``ename`` of every refusal.
ENAME = "ProtocolError"
#: Violations spelled out in one ``evalue`` (the traceback lists all).
EVALUE_VIOLATIONS = 8
#: The extra that brings msgspec's dependencies.
EXTRA = "trikernel[conformance]"


@dataclass(frozen=True, slots=True)
class Refused(Message):
    """A parsed, correctly signed message that departs from the spec.

    ``violations``: the departures (never empty), header first, each a
    :class:`trikernel.msgspec.Violation` (``field``, ``expected``, ``got``,
    ``section``).
    """

    violations: tuple[Violation, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :class:`StrictCheck` found in one message.

    ``violations``: departures that refuse it; ``deprecated``: defined but
    deprecated forms (served, noted in the message log).
    """

    violations: tuple[Violation, ...] = ()
    deprecated: tuple[Violation, ...] = ()


class StrictCheck:
    """Validates incoming messages (messaging spec 5.5, trikernel.msgspec).

    Call it as ``check(channel, msg)`` with ``channel`` shell, control or
    stdin; returns a :class:`Verdict`. Never raises for any message
    content. Create it with :func:`load`.
    """

    def __init__(self, validate: Callable[..., list[Violation]]):
        self._validate = validate

    def __call__(self, channel: str, msg: Message) -> Verdict:
        found = self._validate(
            {
                "header": msg.header,
                "parent_header": msg.parent_header,
                "metadata": msg.metadata,
                "content": msg.content,
                "buffers": msg.buffers,
            },
            channel=channel,
            sender="client",
        )
        if not found:
            return _CLEAN
        return Verdict(
            tuple(v for v in found if not v.deprecated),
            tuple(v for v in found if v.deprecated),
        )

    @staticmethod
    def refuse(msg: Message, violations: Sequence[Violation]) -> Refused:
        """``msg`` as a :class:`Refused` carrying ``violations``."""
        return Refused(
            msg.header, msg.parent_header, msg.metadata, msg.content, msg.buffers, msg.identities, tuple(violations)
        )


_CLEAN = Verdict()


def load() -> StrictCheck:
    """The check, with trikernel.msgspec imported (jupyter_kernel_test, jsonschema).

    Raises ConfigError (one line naming ``--strict`` and the extra to
    install) when those packages are missing.
    """
    try:
        from trikernel.protocol.msgspec import validate_message
    except ImportError as exc:
        missing = exc.name or "a dependency"
        raise ConfigError(f"--strict needs {missing}, which is not installed: pip install '{EXTRA}'") from None
    return StrictCheck(validate_message)


def refusal(msg_type: str, violations: Sequence[Violation]) -> dict[str, Any]:
    """``ename`` / ``evalue`` / ``traceback`` of the answer to a refused message.

    ``evalue``: ``"<msg_type> does not conform: <field>: expected <what>,
    got <what> [<spec section>]; ..."`` (at most EVALUE_VIOLATIONS, then how
    many more); ``traceback``: one line per violation. Used as the content
    of the IOPub ``error``, and with ``status: error`` as the reply.
    """
    lines = [str(v) for v in violations]
    shown = "; ".join(lines[:EVALUE_VIOLATIONS])
    more = len(lines) - EVALUE_VIOLATIONS
    if more > 0:
        shown += f"; and {more} more"
    return {
        "ename": ENAME,
        "evalue": f"{msg_type} does not conform: {shown}",
        "traceback": [f"{ENAME}: {msg_type} refused by trikernel --strict, not run ({_count(len(lines))})", *lines],
    }


def _count(n: int) -> str:
    return f"{n} violation" if n == 1 else f"{n} violations"


def log_detail(msg_type: str, violations: Sequence[Violation]) -> str:
    """A kernel-log line for a refusal: fields, expectations and sections,
    never the peer's values (badinput.py logs no content)."""
    first = violations[0]
    more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
    return f"{msg_type[:40]!r} refused: {first.field}: expected {first.expected} [{first.section}]{more}"
