"""The five kernel channels: names, order, socket types and port fields.

The one place these are defined (jupyter_client docs/messaging.rst,
"Introduction" and "The Wire Protocol"; docs/kernels.rst, "Connection
files"). Every other module imports them from here: the connection file
parser (config), socket creation (sockets), socket options (sockopts), the
JEP 66 handshake and the command line.

Pure: no zmq. Socket types are given by their libzmq names; sockets.py maps
them to pyzmq constants.

Runs on: any thread (pure constants: no zmq, no trio).
"""

from __future__ import annotations

from typing import Final, Literal

Channel = Literal["shell", "iopub", "stdin", "control", "hb"]

#: The five channels, in the order the spec lists their ports.
CHANNELS: Final[tuple[Channel, ...]] = ("shell", "iopub", "stdin", "control", "hb")

#: libzmq socket type of each channel on the kernel side. ``hb`` is a ROUTER
#: echoed in C by ``zmq.proxy`` (heartbeat.py); ``iopub`` is an XPUB so that
#: the kernel sees subscriptions (JEP 65 iopub_welcome).
SOCKET_TYPE_NAMES: Final[dict[Channel, str]] = {
    "shell": "ROUTER",
    "iopub": "XPUB",
    "stdin": "ROUTER",
    "control": "ROUTER",
    "hb": "ROUTER",
}

#: Channels whose messages the kernel reads and answers (ROUTER, signed).
REQUEST_CHANNELS: Final[tuple[Channel, ...]] = ("shell", "stdin", "control")


def port_field(channel: str) -> str:
    """The connection-file field of ``channel``'s port: ``"shell"`` → ``"shell_port"``."""
    return f"{channel}_port"


#: ``("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")``.
PORT_FIELDS: Final[tuple[str, ...]] = tuple(port_field(c) for c in CHANNELS)
