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

Order: an ``input_request`` leaves only after every IOPub message queued
before it, so the text a cell printed before ``input()`` reaches the client
before the prompt (vscode-jupyter#13039): it waits in the IOPub FIFO behind
them (IOPubQueue.put_ordered) and the iopub task sends it.

Every pending request has its own slot, keyed by the ``input_request``'s
``msg_id``; an ``input_reply`` is matched through its ``parent_header``, so
two ``input()`` calls at once (a cell and a thread) each get their own
answer.

The client's stdin socket is a connection of its own, and it may join
after the request that calls ``input()`` arrived on shell (a client started
with its kernel connects each socket on its own, retrying every 100 ms):
the ROUTER then cannot route the ``input_request`` yet (EHOSTUNREACH). The
bridge tries again, every ``RETRY_MIN_DELAY`` doubling to
``RETRY_MAX_DELAY``, for up to ``ROUTE_TIMEOUT``; a request still not
delivered then makes ``input()`` raise IPython's
``StdinNotImplementedError`` (what it raises when the request said
``allow_stdin: false``; raised here as ``trikernel.errors.InputNotDelivered``,
which the user side turns into it), never wait for ever for an answer that cannot come.

With ``--strict`` an ``input_reply`` that departs from the spec (no
``value``, say) arrives as a ``strict.Refused``: it answers nothing (the
``input()`` keeps waiting) and the kernel publishes an IOPub ``error``
(``ProtocolError``) parented to it, as the spec defines no reply on stdin.

Runs on: the io run (:meth:`StdinBridge.serve`, the stdin task);
:meth:`StdinBridge.request_input` on any user thread, which it blocks
until the answer comes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import TYPE_CHECKING

import trio

from trikernel.core.badinput import short
from trikernel.errors import InputNotDelivered
from trikernel.protocol.strict import Refused, refusal
from trikernel.protocol.wire import Message, serialize

if TYPE_CHECKING:
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.protocol.wire import Received
    from trikernel.server.inbound import InboundParser
    from trikernel.server.iopubqueue import IOPubQueue
    from trikernel.server.sockets import TrioSocket

log = logging.getLogger("trikernel.stdin")

#: Seconds between checks for an interrupt while user code waits for input.
POLL_INTERVAL = 0.2
#: Seconds an undeliverable ``input_request`` is retried (its client's stdin
#: socket not connected yet, or past its high-water mark) before input() fails.
ROUTE_TIMEOUT = 5.0
#: Backoff bounds (seconds) between two delivery attempts.
RETRY_MIN_DELAY = 0.005
RETRY_MAX_DELAY = 0.1


class _Slot:
    __slots__ = ("abandoned", "error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value = ""
        self.error: BaseException | None = None
        self.abandoned = False  # Ctrl-C ended the wait: the request is not sent any more


class StdinBridge:
    """Carries input requests from user threads to the stdin channel and back.

    ``parse``: the connection's InboundParser; it turns frames read from
    the stdin socket into a Message, or None for bad input (recorded by
    it), and the bridge uses its ``signer`` for every ``input_request``,
    its ``bad_input`` for stray or unexpected stdin messages and its
    ``message_log`` (``--message-log``, or None) to record every
    ``input_request`` sent. ``iopub``: the IOPub queue every
    ``input_request`` waits in behind the output queued before it (module
    docstring), and where the answer to a message ``--strict`` refused is
    published; None (tests): requests leave at once.
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
        self._nursery: trio.Nursery | None = None  # retries of undelivered requests (serve's)
        self._pending: dict[str, _Slot] = {}  # input_request msg_id -> slot; touched in the io run only

    # -- user threads ----------------------------------------------------------
    def request_input(self, parent: Message, prompt: str, password: bool) -> str:
        """Ask the client that sent ``parent`` for a line; blocks until it answers.

        Call from any thread but the io thread. Ctrl-C (KeyboardInterrupt on
        the main thread) abandons the request. Returns the reply's
        ``value``; raises EOFError when it is ``"\\x04"`` (Ctrl-D in
        jupyter console), InputNotDelivered when the request could
        not be delivered within ``ROUTE_TIMEOUT`` (module docstring). If the
        kernel shuts down meanwhile, the wait ends with the process (an
        interrupt at shutdown ends it first).
        """
        token = self._io_token
        if token is None:
            raise RuntimeError("the stdin channel is not being served yet")
        slot = _Slot()
        msg = self._builder.msg(
            "input_request", {"prompt": prompt, "password": password}, parent.header, identities=parent.identities
        )
        # behind the IOPub messages queued so far (what the cell printed before
        # input()), or at once when none is left (IOPubQueue.put_ordered)
        if self._iopub is None or not self._iopub.put_ordered(functools.partial(self._send_request, msg, slot)):
            token.run_sync_soon(self._send_request, msg, slot)
        try:
            while not slot.event.wait(POLL_INTERVAL):
                pass
        except KeyboardInterrupt:
            slot.abandoned = True  # a request still queued behind IOPub is never sent
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._pending.pop, msg.msg_id, None)
            raise
        if slot.error is not None:
            raise slot.error
        if slot.value == "\x04":
            raise EOFError("end of input")
        return slot.value

    # -- io run ----------------------------------------------------------------
    def _send_request(self, msg: Message, slot: _Slot) -> None:
        assert self._nursery is not None
        if slot.abandoned:
            return
        self._pending[msg.msg_id] = slot
        frames = serialize(msg, self._parse.signer)
        if self._try_send(frames):
            self._record(frames, delivered=True)
        else:
            self._nursery.start_soon(self._deliver, msg.msg_id, frames, slot)

    def _try_send(self, frames: list[bytes]) -> bool:
        assert self._sock is not None
        return self._sock.send_nowait(frames, quiet=True)

    def _record(self, frames: list[bytes], *, delivered: bool) -> None:
        if self._parse.message_log is not None:
            self._parse.message_log.record("out", "stdin", frames, None if delivered else {"undelivered": True})

    async def _deliver(self, msg_id: str, frames: list[bytes], slot: _Slot) -> None:
        """Retry an input_request the ROUTER could not route (module docstring)."""
        deadline = trio.current_time() + ROUTE_TIMEOUT
        delay = RETRY_MIN_DELAY
        while self._pending.get(msg_id) is slot:  # not abandoned by an interrupt
            if trio.current_time() >= deadline:
                self._pending.pop(msg_id, None)
                self._record(frames, delivered=False)
                log.warning(
                    "stdin: input_request not delivered in %.1fs: the client's stdin channel is not connected",
                    ROUTE_TIMEOUT,
                )
                slot.error = InputNotDelivered(
                    f"input was called, but the frontend's stdin channel did not connect within {ROUTE_TIMEOUT:g}s"
                )
                slot.event.set()
                return
            await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
            delay = min(delay * 2, RETRY_MAX_DELAY)
            if self._pending.get(msg_id) is not slot:
                return  # abandoned (Ctrl-C) while we slept: a late prompt would answer no one
            if self._try_send(frames):
                self._record(frames, delivered=True)
                return

    async def serve(self, sock: TrioSocket, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The stdin channel task (io run): reads ``input_reply`` messages and
        wakes the thread waiting for each, and retries undelivered requests.
        Anything else is logged and dropped."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._sock = sock
            self._io_token = trio.lowlevel.current_trio_token()
            task_status.started()
            while True:
                refused = self._on_frames(await sock.recv_multipart())
                if refused is not None and self._iopub is not None:
                    content = refusal(refused.msg_type, refused.violations)
                    await self._iopub.put(self._builder.iopub("error", content, refused.header))

    def _on_frames(self, frames: list[Received]) -> Refused | None:
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
