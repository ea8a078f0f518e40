"""The Debug Adapter Protocol side of the debugger: the connection to
debugpy's adapter.

Runs on: the io thread's trio run only (debugger.py says which part of the
debugger runs where). :class:`DapClient` speaks DAP's base protocol
(``Content-Length`` header, JSON body) over a trio stream and matches each
response to its request by ``request_seq``, never by arrival order
(ipykernel 6.30.0 broke on that). The Variables panel the kernel answers
itself while no thread is stopped is variables.py, in the user run.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = logging.getLogger("trikernel.dap")

#: Seconds a request sent to debugpy waits for its response, then fails
#: (a response that never comes must not wedge the kernel).
REQUEST_TIMEOUT = 15.0
#: Bytes of one DAP message the reader accepts from the adapter.
MAX_DAP_MESSAGE = 64 << 20


# -- io run: the connection to debugpy's adapter -------------------------------------


class DapError(Exception):
    """The adapter connection failed or a request got no response in time (io run)."""


@dataclass(eq=False)
class _Pending:
    event: trio.Event = field(default_factory=trio.Event)
    response: dict[str, Any] | None = None


class DapClient:
    """A DAP client over a trio TCP stream to debugpy's adapter (io run only).

    :meth:`request` sends with a sequence number of its own and waits for the
    response whose ``request_seq`` is that number (DAP "ProtocolMessage"):
    concurrent requests, events in between and responses out of order are
    all matched right. :meth:`serve` is the one reader; it awaits
    ``on_event`` for each DAP event, in the order debugpy sent them (so the
    events reach IOPub in that order by construction).
    """

    def __init__(self, stream: trio.abc.Stream, on_event: Callable[[dict[str, Any]], Awaitable[None]]):
        self._stream = stream
        self._on_event = on_event
        self._seq = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._send_lock = trio.Lock()
        self.closed = False

    async def request(
        self, command: str, arguments: dict[str, Any] | None = None, *, limit: float = REQUEST_TIMEOUT
    ) -> dict[str, Any]:
        """Send ``command`` and return its response (a DAP Response dict).

        Raises DapError if the connection is closed or no response comes
        within ``limit`` seconds.
        """
        pending = await self.send(command, arguments)
        return await self.wait(pending, command, limit=limit)

    async def send(self, command: str, arguments: dict[str, Any] | None = None) -> tuple[int, _Pending]:
        """Send a request; returns the handle :meth:`wait` takes."""
        if self.closed:
            raise DapError("the debugger is not connected")
        seq = next(self._seq)
        msg: dict[str, Any] = {"seq": seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        pending = self._pending[seq] = _Pending()
        body = json.dumps(msg, ensure_ascii=False, allow_nan=False, default=str).encode("utf-8")
        try:
            async with self._send_lock:
                await self._stream.send_all(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._pending.pop(seq, None)
            raise DapError(f"the connection to debugpy failed: {exc}") from None
        return seq, pending

    async def wait(
        self, handle: tuple[int, _Pending], command: str, *, limit: float = REQUEST_TIMEOUT
    ) -> dict[str, Any]:
        """Wait for the response to a request :meth:`send` sent (``handle``: what it returned)
        and return it, a DAP Response dict; the handle is forgotten either way. Raises
        DapError naming ``command`` if the connection closed or no response came within
        ``limit`` seconds (:data:`REQUEST_TIMEOUT`). io run only."""
        seq, pending = handle
        try:
            with trio.move_on_after(limit):
                await pending.event.wait()
        finally:
            self._pending.pop(seq, None)
        if pending.response is None:
            if self.closed:
                raise DapError(f"{command}: the connection to debugpy closed")
            raise DapError(f"{command}: debugpy sent no response within {limit:g}s")
        return pending.response

    async def serve(self) -> None:
        """Read DAP messages until the adapter closes the stream (reader task)."""
        buf = b""
        try:
            while True:
                header_end = buf.find(b"\r\n\r\n")
                while header_end < 0:
                    chunk = await self._stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                    header_end = buf.find(b"\r\n\r\n")
                length = _content_length(buf[:header_end])
                start = header_end + 4
                while len(buf) < start + length:
                    chunk = await self._stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[start : start + length], buf[start + length :]
                event = self._dispatch(body)
                if event is not None:
                    await self._on_event(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, DapError) as exc:
            log.info("debugpy connection ended: %s", exc)
        finally:
            self._close_pending()

    def _dispatch(self, body: bytes) -> dict[str, Any] | None:
        """Wake the request a response answers; return an event (else None)."""
        try:
            msg = json.loads(body)
        except ValueError:
            log.warning("debugpy sent a message that is not JSON; dropped")
            return None
        if not isinstance(msg, dict):
            return None
        if msg.get("type") == "event":
            return msg
        if msg.get("type") == "response":
            pending = self._pending.get(msg.get("request_seq"))  # type: ignore[arg-type]
            if pending is None:
                log.debug("debugpy response to no waiting request: %s", msg.get("command"))
                return None
            pending.response = msg
            pending.event.set()
        return None

    def _close_pending(self) -> None:
        self.closed = True
        for pending in self._pending.values():
            pending.event.set()

    async def aclose(self) -> None:
        """Close the stream to debugpy's adapter: mark the client closed and wake every waiting
        request (each then raises DapError), then close the stream; :meth:`serve` ends. io run
        only."""
        self._close_pending()
        await self._stream.aclose()


def _content_length(header: bytes) -> int:
    for line in header.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                break
            if 0 <= length <= MAX_DAP_MESSAGE:
                return length
            break
    raise DapError(f"bad DAP header from debugpy: {header[:80]!r}")
