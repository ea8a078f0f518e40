"""The gateway comm port: the server's plain-TCP line to a remotely launched kernel.

Runs in the io run (thread "trikernel-io") as one service task
(``Kernel(services=...)``, trikernel.kernel), so no process is forked
for it: the listener lives and dies with the kernel process (see
:func:`service`), and nothing is left listening after the kernel exits.

Protocol (gateway_provisioners 0.5.0 ``remote_provisioner.py``
``_send_listener_request`` and ``kernel-launchers/shared/scripts/server_listener.py``;
Enterprise Gateway 3.3.0 ``processproxy.py`` and ``launch_ipykernel.py``,
which agree): the server connects, sends ONE JSON object, and closes its
side; nothing is sent back. ``{"signum": n}`` asks for signal ``n`` (0 is the
liveness poll, about every 3 s: an accepted connection is the answer, and a
refused one means the kernel is gone); ``{"shutdown": 1}`` tells the
launcher the kernel is being shut down. The requests are parsed by
:func:`trikernel.gateway.parse_comm_request`.

Bounds (module constants): a request larger than :data:`COMM_MAX_BYTES`,
or one whose peer does not close within :data:`COMM_READ_TIMEOUT` seconds,
is logged and dropped; at most :data:`COMM_MAX_CONNECTIONS` connections are
read at once (more wait in the listen backlog). Every outcome is counted in
:class:`CommPortStats`.

The port is not authenticated (the protocol has no key): anyone who can
reach it can interrupt or signal the kernel, as with the stock launchers.
Bind it to an address only the server can reach (``gateway-launch --ip``).

Runs on: the io run (one service task, one task per connection);
:func:`bind_comm_listener` on the main thread at start-up, before the io
thread starts.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import trio

from trikernel.errors import ProtocolError
from trikernel.protocol.gateway import parse_comm_request
from trikernel.server.sockets import bind_in_range

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.server.iorun import Service

log = logging.getLogger("trikernel.commport")

#: Largest request accepted, in bytes (a real one is under 30).
COMM_MAX_BYTES = 4096
#: Seconds a peer has to send its request and close its side.
COMM_READ_TIMEOUT = 5.0
#: Connections read at once; more wait in the kernel's listen backlog.
COMM_MAX_CONNECTIONS = 16


@dataclass
class CommPortStats:
    """What the comm port has seen (counts since start; io run only)."""

    polls: int = 0  #: ``{"signum": 0}`` liveness polls
    signals: int = 0  #: requests with a signal number other than 0
    shutdowns: int = 0  #: ``{"shutdown": 1}`` requests
    empty: int = 0  #: connections closed without a byte (e.g. TCP health checks)
    dropped: int = 0  #: malformed, too large, too slow or broken requests

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (``polls``, ``signals``, ``shutdowns``, ``empty``,
        ``dropped``: counts since start-up). io run."""
        return asdict(self)


#: Listen backlog of the comm socket.
COMM_BACKLOG = 16


def bind_comm_listener(ip: str, port_range: tuple[int, int] | None) -> socket.socket:
    """A listening TCP socket for the comm port on ``ip``: any port, or a free one in ``port_range``.

    Bound without SO_REUSEADDR, so the bind alone makes the port this
    socket's (with SO_REUSEADDR, Linux lets a second socket bind the same
    port until one of them listens). Kept: the port reported is the port
    held. Raises BindError (no free port in the range) or OSError.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if port_range is None:
            sock.bind((ip, 0))
        else:
            bind_in_range(sock, "comm port", lambda port: (ip, port), port_range)
        sock.listen(COMM_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_comm_port(
    listener: trio.SocketListener,
    *,
    on_signal: Callable[[int], None],
    on_shutdown: Callable[[], None],
    stats: CommPortStats | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the comm port on ``listener`` until cancelled; then close it.

    Args:
        listener: a listening trio socket; owned (and closed) by this task from the call on.
        on_signal: called with ``n`` for ``{"signum": n}``, ``n`` > 0, in the io run
            (trikernel.gateway: 2 interrupts the kernel like ``interrupt_request``,
            other numbers signal the kernel process). Must not block.
        on_shutdown: called for ``{"shutdown": <true>}`` (after ``on_signal`` when a
            request has both), in the io run. Must not block.
        stats: counters to update (a fresh :class:`CommPortStats` if None).
        task_status: ``started()`` once the listener is being served.

    A request that is not one JSON object, names no ``signum``/``shutdown``,
    is too large, too slow, or whose connection breaks, is logged at
    warning level and dropped; a callback that raises is logged and the
    port keeps serving.

    Cancellation: connections being read are abandoned and the listener is
    closed before this returns.
    """
    counters = stats if stats is not None else CommPortStats()
    slots = trio.Semaphore(COMM_MAX_CONNECTIONS)
    async with listener, trio.open_nursery() as nursery:
        task_status.started()
        while True:
            await slots.acquire()
            try:
                stream = await listener.accept()
            except BaseException:
                slots.release()
                raise
            nursery.start_soon(_serve_connection, stream, slots, counters, on_signal, on_shutdown)


async def _serve_connection(
    stream: trio.SocketStream,
    slots: trio.Semaphore,
    stats: CommPortStats,
    on_signal: Callable[[int], None],
    on_shutdown: Callable[[], None],
) -> None:
    try:
        async with stream:
            data = await _read_request(stream, stats)
    finally:
        slots.release()
    if data is None:
        return
    if not data:
        stats.empty += 1
        log.debug("comm port: a connection closed without a request")
        return
    try:
        request = parse_comm_request(data)
    except ProtocolError as exc:
        stats.dropped += 1
        log.warning("comm port: dropped a bad request: %s", exc)
        return
    if request.signum == 0:
        stats.polls += 1
    elif request.signum is not None:
        stats.signals += 1
        log.info("comm port: signal %d requested", request.signum)
        _call(on_signal, request.signum)
    if request.shutdown:
        stats.shutdowns += 1
        log.info("comm port: shutdown requested")
        _call(on_shutdown)


async def _read_request(stream: trio.SocketStream, stats: CommPortStats) -> bytes | None:
    """Everything the peer sends before closing its side; None if dropped."""
    data = bytearray()
    with trio.move_on_after(COMM_READ_TIMEOUT) as scope:
        try:
            while chunk := await stream.receive_some(COMM_MAX_BYTES + 1):
                data += chunk
                if len(data) > COMM_MAX_BYTES:
                    stats.dropped += 1
                    log.warning("comm port: dropped a request larger than %d bytes", COMM_MAX_BYTES)
                    return None
        except trio.BrokenResourceError as exc:
            stats.dropped += 1
            log.warning("comm port: dropped a request whose connection broke: %s", exc.__cause__ or exc)
            return None
    if scope.cancelled_caught:
        stats.dropped += 1
        log.warning("comm port: dropped a request not completed within %g s", COMM_READ_TIMEOUT)
        return None
    return bytes(data)


def _call(callback: Callable[..., None], *args: int) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("comm port: handling a request failed")


def service(
    sock: socket.socket,
    *,
    on_signal: Callable[[int], None],
    on_shutdown: Callable[[], None],
    stats: CommPortStats | None = None,
) -> Service:
    """An io-run service (``Kernel(services=...)``) serving the listening stdlib ``sock``.

    ``sock`` was bound and put in listening state on the main thread before
    the io thread started (the thread start is the hand-over). The service
    serves a duplicate of its descriptor and closes that; ``sock`` itself
    stays open, and listening, until its owner closes it. The launcher
    leaves it to the process exit, so that the server's liveness poll (a
    connection the backlog accepts) says "alive" for as long as the process
    lives and "gone" once it has really ended. Requests that arrive after
    the service ended (while IOPub flushes and the process exits) are
    accepted by the backlog and not acted on.
    """

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock.dup()))
        await serve_comm_port(
            listener, on_signal=on_signal, on_shutdown=on_shutdown, stats=stats, task_status=task_status
        )

    return run
