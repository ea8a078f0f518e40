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

import zmq

from .config import CHANNELS, ConnectionInfo
from .errors import ConfigError, TrikernelError

log = logging.getLogger("trikernel.sockets")

SOCKET_TYPES = {
    "shell": zmq.ROUTER,
    "control": zmq.ROUTER,
    "stdin": zmq.ROUTER,
    "iopub": zmq.XPUB,
    "hb": zmq.ROUTER,
}

#: Called with (socket, channel) before bind; applies configured options.
Configure = Callable[[zmq.Socket, str], None]


class BindError(TrikernelError):
    """A port could not be bound (e.g. already in use). Local to this host."""


@dataclass
class BoundSockets:
    """The five bound sockets and the ports they got."""

    context: zmq.Context
    hb_context: zmq.Context
    sockets: dict[str, zmq.Socket]
    ports: dict[str, int]  # {"shell_port": n, ...}

    def close(self, linger: int | None = None) -> None:
        for s in self.sockets.values():
            if not s.closed:
                s.close(linger=linger)


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
