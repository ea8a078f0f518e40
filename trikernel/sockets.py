"""The only module that creates ZeroMQ sockets.

Creates the five channel sockets, applies every option (socket options from
``sockopts``, CurveZMQ server keys) BEFORE bind — libzmq copies options
into the listener at bind time, so a subscriber that connects later gets
the values in force then — and binds given or random ports.

Owners after creation: shell/control/stdin → their tasks in channels.py,
iopub → iopub.py's task, hb → heartbeat.py's thread. Sockets are created on
the main thread before the io thread starts (the thread start is the memory
barrier ZeroMQ asks for when a socket changes threads).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from .channels import CHANNELS, SOCKET_TYPE_NAMES
from .config import ConnectionInfo
from .errors import BindError, ConfigError

log = logging.getLogger("trikernel.sockets")

#: pyzmq socket type of each channel (names in channels.py).
SOCKET_TYPES: dict[str, int] = {c: int(getattr(zmq, t)) for c, t in SOCKET_TYPE_NAMES.items()}

#: Called with (socket, channel) before bind; applies configured options.
Configure = Callable[[zmq.Socket, str], None]


@dataclass
class BoundSockets:
    """The five bound sockets and the ports they got."""

    context: zmq.Context
    hb_context: zmq.Context
    sockets: dict[str, zmq.Socket]
    ports: dict[str, int]  # {"shell_port": n, ...}

    def close(self, linger: int | None = None, *, hb: bool = False) -> None:
        """Close the sockets; hb only with ``hb=True`` (once its thread runs,
        the thread closes it when hb_context terminates)."""
        for name, s in self.sockets.items():
            if (hb or name != "hb") and not s.closed:
                s.close(linger=linger)

    def destroy(self) -> None:
        """Close everything at once (start-up failed; no thread owns a socket yet)."""
        self.close(linger=0, hb=True)
        self.context.term()
        self.hb_context.term()


def _apply_curve(sock: zmq.Socket, conn: ConnectionInfo) -> None:
    if conn.curve_secretkey is None:
        return
    if not zmq.has("curve"):
        raise ConfigError("connection file: curve keys given but this libzmq has no CURVE support")
    sock.curve_server = True
    sock.curve_secretkey = conn.curve_secretkey
    assert conn.curve_publickey is not None
    sock.curve_publickey = conn.curve_publickey


def create_and_bind(conn: ConnectionInfo, configure: Configure) -> BoundSockets:
    """Create, configure and bind all five channels.

    Ports of 0 in ``conn`` are bound randomly. Raises BindError naming the
    channel and port if a bind fails; already-created sockets are closed.
    """
    ctx = zmq.Context()
    hb_ctx = zmq.Context()  # heartbeat on its own context: its C loop never shares an io thread
    socks: dict[str, zmq.Socket] = {}
    ports: dict[str, int] = {}
    try:
        for channel in CHANNELS:
            c = hb_ctx if channel == "hb" else ctx
            sock = c.socket(SOCKET_TYPES[channel])
            socks[channel] = sock
            configure(sock, channel)
            _apply_curve(sock, conn)
            port = conn.port(channel)
            try:
                if port > 0:
                    sock.bind(conn.url(channel, port))
                elif conn.transport == "tcp":
                    port = sock.bind_to_random_port(f"tcp://{conn.ip}")
                else:
                    port = _bind_random_ipc(sock, conn)
            except zmq.ZMQError as exc:
                why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise BindError(f"cannot bind {channel} channel to {conn.url(channel, port)}: {why}") from None
            ports[f"{channel}_port"] = port
    except BaseException:
        for s in socks.values():
            s.close(linger=0)
        ctx.term()
        hb_ctx.term()
        raise
    log.debug("bound %s", ports)
    return BoundSockets(ctx, hb_ctx, socks, ports)


def _bind_random_ipc(sock: zmq.Socket, conn: ConnectionInfo) -> int:
    import os

    for n in range(1, 65536):
        path = f"{conn.ip}-{n}"
        if not os.path.exists(path):
            sock.bind(f"ipc://{path}")
            return n
    raise BindError("no free ipc path")  # pragma: no cover


class TrioSocket:
    """Drive one ZeroMQ socket from tasks of one trio run.

    ZeroMQ's ``ZMQ_FD`` is edge-triggered, and every send, recv or
    ``getsockopt(EVENTS)`` may consume the edge that announced an incoming
    message (zmq_getsockopt(3), "ZMQ_FD"). So: the one reader always tries a
    non-blocking recv before it waits on the FD, and every send re-checks
    ``EVENTS`` afterwards and wakes the reader if a message is pending.
    (zmq-anyio 0.4.1 lost shell requests this way when a reply was sent
    while its reader waited — reproduced in tests/test_kernel.py's
    extra-subscriber test — so trikernel drives sockets itself.)

    One task may call :meth:`recv_multipart` at a time; any task of the same
    run may call :meth:`send_multipart`.
    """

    def __init__(self, sock: zmq.Socket, name: str):
        self.sock = sock
        self.name = name
        self.fd = int(sock.getsockopt(zmq.FD))
        self._waiter: Any = None  # the reader's trio.CancelScope while it waits

    async def recv_multipart(self) -> list[bytes]:
        import trio

        while True:
            try:
                return self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
            with trio.CancelScope() as scope:
                self._waiter = scope
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                finally:
                    self._waiter = None

    def send_multipart(self, frames: list[bytes]) -> None:
        """Send without blocking; a ROUTER drops for a peer past its HWM."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("%s: peer not reading (HWM reached); a reply was dropped", self.name)
        finally:
            if self._waiter is not None and int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                self._waiter.cancel()
