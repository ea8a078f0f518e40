"""The stdin bridge: ``input()`` / ``getpass()`` in user code ↔ the stdin channel.

Messaging spec "Messages on the stdin (ROUTER/DEALER) channel": the kernel
sends ``input_request`` (``prompt``, ``password``) to the client that sent
the running request, on the stdin channel, and waits for its
``input_reply`` (``value``).

Threads: :meth:`StdinBridge.request_input` is called by user code on any
user thread (the cell on the main thread, or a thread the cell started) and
blocks that thread. :meth:`StdinBridge.serve` is the stdin channel task of
the io run, the socket's one owner. The hand-off is the io run's
``TrioToken.run_sync_soon`` one way and a ``threading.Event`` the other.

Every pending request has its own slot, keyed by the ``input_request``'s
``msg_id``; an ``input_reply`` is matched through its ``parent_header``, so
two ``input()`` calls at once (a cell and a thread) each get their own
answer.

With ``--strict`` an ``input_reply`` that departs from the spec (no
``value``, say) arrives as a ``strict.Refused``: it answers nothing (the
``input()`` keeps waiting) and the kernel publishes an IOPub ``error``
(``ProtocolError``) parented to it, as the spec defines no reply on stdin.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING

import trio

from .badinput import short
from .strict import Refused, refusal
from .wire import Message, serialize

if TYPE_CHECKING:
    from .inbound import InboundParser
    from .iopub import IOPubQueue
    from .messages import MessageBuilder
    from .sockets import TrioSocket

log = logging.getLogger("trikernel.stdin")

#: Seconds between checks for an interrupt while user code waits for input.
POLL_INTERVAL = 0.2


class _Slot:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value = ""


class StdinBridge:
    """Carries input requests from user threads to the stdin channel and back.

    ``parse``: the connection's InboundParser; it turns frames read from
    the stdin socket into a Message, or None for bad input (recorded by
    it), and the bridge uses its ``signer`` for every ``input_request``,
    its ``bad_input`` for stray or unexpected stdin messages and its
    ``message_log`` (``--message-log``, or None) to record every
    ``input_request`` sent. ``iopub``: where the answer to a message
    ``--strict`` refused is published.
    """

    def __init__(
        self,
        builder: MessageBuilder,
        parse: InboundParser,
        *,
        iopub: IOPubQueue | None = None,
    ):
        self._builder = builder
        self._parse = parse
        self._iopub = iopub
        self._sock: TrioSocket | None = None
        self._io_token: trio.lowlevel.TrioToken | None = None
        self._pending: dict[str, _Slot] = {}  # input_request msg_id -> slot; touched in the io run only

    # -- user threads ----------------------------------------------------------
    def request_input(self, parent: Message, prompt: str, password: bool) -> str:
        """Ask the client that sent ``parent`` for a line; blocks until it answers.

        Call from any thread but the io thread. Ctrl-C (KeyboardInterrupt on
        the main thread) abandons the request. Returns the reply's
        ``value``; raises EOFError when it is ``"\\x04"`` (Ctrl-D in
        jupyter console). If the kernel shuts down meanwhile, the wait ends
        with the process (an interrupt at shutdown ends it first).
        """
        token = self._io_token
        if token is None:
            raise RuntimeError("the stdin channel is not being served yet")
        slot = _Slot()
        msg = self._builder.msg(
            "input_request", {"prompt": prompt, "password": password}, parent.header, identities=parent.identities
        )
        token.run_sync_soon(self._send_request, msg, slot)
        try:
            while not slot.event.wait(POLL_INTERVAL):
                pass
        except KeyboardInterrupt:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._pending.pop, msg.msg_id, None)
            raise
        if slot.value == "\x04":
            raise EOFError("end of input")
        return slot.value

    # -- io run ----------------------------------------------------------------
    def _send_request(self, msg: Message, slot: _Slot) -> None:
        assert self._sock is not None
        self._pending[msg.msg_id] = slot
        frames = serialize(msg, self._parse.signer)
        delivered = self._sock.send_nowait(frames)
        if self._parse.message_log is not None:
            self._parse.message_log.record("out", "stdin", frames, None if delivered else {"undelivered": True})

    async def serve(self, sock: TrioSocket, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The stdin channel task (io run): reads ``input_reply`` messages and
        wakes the thread waiting for each. Anything else is logged and dropped."""
        self._sock = sock
        self._io_token = trio.lowlevel.current_trio_token()
        task_status.started()
        while True:
            refused = self._on_frames(await sock.recv_multipart())
            if refused is not None and self._iopub is not None:
                content = refusal(refused.msg_type, refused.violations)
                await self._iopub.send(self._builder.iopub("error", content, refused.header))

    def _on_frames(self, frames: list[bytes]) -> Refused | None:
        """An input_reply answers its pending input(); anything else is bad
        input. Returns a message ``--strict`` refused, to be answered."""
        msg = self._parse("stdin", frames)
        del frames
        if msg is None:
            return None
        if isinstance(msg, Refused):
            return msg
        if msg.msg_type != "input_reply":
            self._parse.bad_input.record("stdin", "unknown_msg_type", f"unexpected message type {short(msg.msg_type)}")
            return None
        slot = self._match(msg)
        if slot is None:
            self._parse.bad_input.record("stdin", "stray_input_reply", "an input_reply that answers no pending request")
            return None
        value = msg.content.get("value", "")
        slot.value = value if isinstance(value, str) else str(value)
        slot.event.set()
        return None

    def _match(self, reply: Message) -> _Slot | None:
        """The pending slot ``reply`` answers: by ``parent_header.msg_id``; a
        reply without one answers the only pending request, if there is one."""
        parent_id = reply.parent_header.get("msg_id")
        if isinstance(parent_id, str) and parent_id:
            return self._pending.pop(parent_id, None)
        if len(self._pending) == 1:
            return self._pending.pop(next(iter(self._pending)))
        return None
