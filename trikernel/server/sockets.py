"""The only module that creates ZeroMQ sockets.

Creates the five channel sockets, applies every option (socket options from
``sockopts``, CurveZMQ server keys) BEFORE bind — libzmq copies options
into the listener at bind time, so a subscriber that connects later gets
the values in force then — and binds given or random ports.

Owners after creation: shell/control → their channel tasks (requests.py),
stdin → stdin.py, iopub and its monitor socket → the iopub task
(iopubtask.py), hb → heartbeat.py's thread. Sockets are created on
the main thread before the io thread starts (the thread start is the memory
barrier ZeroMQ asks for when a socket changes threads).

Runs on: the main thread (creation and bind, before the io thread
starts); a :class:`TrioSocket` in its owner's trio run, except
:meth:`TrioSocket.send_from_thread` (the thread that ran the request).
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from trikernel.errors import BindError, ConfigError
from trikernel.protocol.channels import CHANNELS, REQUEST_CHANNELS, SOCKET_TYPE_NAMES

if TYPE_CHECKING:
    from trikernel.protocol.connection import ConnectionInfo
    from trikernel.protocol.wire import Received

log = logging.getLogger("trikernel.sockets")

#: Seconds between two log lines about undeliverable replies on one socket.
DROP_LOG_INTERVAL = 5.0

#: Frames up to this size (bytes) are received as ``bytes``; longer ones as
#: a ``memoryview`` of the buffer libzmq received them into, never copied
#: (pyzmq's ``copy_threshold``, 64 KiB, on the receiving side): a 64 MiB
#: + 1 JSON frame the inbound parser drops unparsed is never held twice
#: (docs/design.md, "Requests").
COPY_THRESHOLD = 1 << 16

#: pyzmq socket type of each channel (names in channels.py).
SOCKET_TYPES: dict[str, int] = {c: int(getattr(zmq, t)) for c, t in SOCKET_TYPE_NAMES.items()}

#: Called with (socket, channel) before bind; applies configured options.
Configure = Callable[[zmq.Socket[bytes], str], None]


@dataclass
class BoundSockets:
    """The five bound sockets and the ports they got.

    ``iopub_monitor``: a PAIR socket that receives the iopub XPUB's
    ``EVENT_ACCEPTED`` and ``EVENT_DISCONNECTED`` (zmq_socket_monitor(3)),
    attached before bind so that no connection is missed; owned by
    the iopub task (iopubtask.py), which counts connections with it.
    """

    context: zmq.Context[zmq.Socket[bytes]]
    hb_context: zmq.Context[zmq.Socket[bytes]]
    sockets: dict[str, zmq.Socket[bytes]]
    ports: dict[str, int]  # {"shell_port": n, ...}
    iopub_monitor: zmq.Socket[bytes] | None = None

    def close(self, linger: int | None = None, *, hb: bool = False) -> None:
        """Close the sockets; hb only with ``hb=True`` (once its thread runs,
        the thread closes it when hb_context terminates)."""
        if self.iopub_monitor is not None and not self.sockets["iopub"].closed:
            # libzmq's own end of the monitor first: a connection event sent to it
            # once our end is closed blocks the I/O thread until context.term()
            self.sockets["iopub"].disable_monitor()
        for name, s in self.sockets.items():
            if (hb or name != "hb") and not s.closed:
                s.close(linger=linger)
        if self.iopub_monitor is not None and not self.iopub_monitor.closed:
            self.iopub_monitor.close(linger=0)  # after the XPUB: its events are not needed any more

    def destroy(self) -> None:
        """Close everything at once (start-up failed; no thread owns a socket yet)."""
        self.close(linger=0, hb=True)
        self.context.term()
        self.hb_context.term()


def _apply_curve(sock: zmq.Socket[bytes], conn: ConnectionInfo) -> None:
    if conn.curve_secretkey is None:
        return
    if not zmq.has("curve"):
        raise ConfigError("connection file: curve keys given but this libzmq has no CURVE support")
    sock.curve_server = True
    sock.curve_secretkey = conn.curve_secretkey
    assert conn.curve_publickey is not None
    sock.curve_publickey = conn.curve_publickey


def curve_keypair() -> tuple[bytes, bytes] | None:
    """A fresh CurveZMQ key pair ``(public, secret)``, Z85 bytes (40 chars
    each), or None when this libzmq has no CURVE support (gateway-launch's
    ``--transport-encryption``). Any thread."""
    if not zmq.has("curve"):
        return None
    public, secret = zmq.curve_keypair()
    return public, secret


def create_and_bind(
    conn: ConnectionInfo, configure: Configure, *, port_range: tuple[int, int] | None = None
) -> BoundSockets:
    """Create, configure and bind all five channels.

    Ports of 0 in ``conn`` are bound randomly: anywhere, or with
    ``port_range=(lower, upper)`` (inclusive, TCP only) on a free port in
    that range (gateway launchers' ``--port-range``; see :func:`bind_in_range`).
    Raises BindError naming the channel and port if a bind fails;
    already-created sockets are closed.
    """
    ctx = zmq.Context()
    hb_ctx = zmq.Context()  # heartbeat on its own context: its C loop never shares an io thread
    socks: dict[str, zmq.Socket[bytes]] = {}
    ports: dict[str, int] = {}
    monitor: zmq.Socket[bytes] | None = None
    try:
        for channel in CHANNELS:
            c = hb_ctx if channel == "hb" else ctx
            sock = c.socket(SOCKET_TYPES[channel])
            socks[channel] = sock
            configure(sock, channel)
            if channel in REQUEST_CHANNELS:
                # a reply that cannot be routed raises (TrioSocket counts and
                # logs it) instead of vanishing silently at a full or gone peer
                sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            _apply_curve(sock, conn)
            if channel == "iopub":
                monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            port = conn.port(channel)
            try:
                if port > 0:
                    sock.bind(conn.url(channel, port))
                elif conn.transport == "tcp" and port_range is not None:
                    port = bind_in_range(sock, f"{channel} channel", functools.partial(conn.url, channel), port_range)
                elif conn.transport == "tcp":
                    port = sock.bind_to_random_port(f"tcp://{conn.ip}")
                else:
                    port = _bind_random_ipc(sock, conn)
            except zmq.ZMQError as exc:
                why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                if ":" in conn.ip and conn.transport == "tcp" and not sock.getsockopt(zmq.IPV6):
                    why += f" (ip {conn.ip!r} is IPv6: ZeroMQ needs --socket-option '*.IPV6=1' for it)"
                raise BindError(f"cannot bind {channel} channel to {conn.url(channel, port)}: {why}") from None
            ports[f"{channel}_port"] = port
    except BaseException:
        for s in socks.values():
            s.close(linger=0)
        if monitor is not None:
            monitor.close(linger=0)
        ctx.term()
        hb_ctx.term()
        raise
    log.debug("bound %s", ports)
    return BoundSockets(ctx, hb_ctx, socks, ports, monitor)


def bind_in_range(sock: Any, what: str, url: Callable[[int], Any], port_range: tuple[int, int]) -> int:
    """Bind ``sock`` to a free port in ``port_range`` (inclusive); return the port.

    Ports are tried in random order, each at most once, so a free port is
    found whenever the range has one; the socket keeps the port it bound
    (nothing is released and re-bound later, so no other process can take
    it in between). ``url(port)`` is what ``sock.bind`` takes: a ZeroMQ
    endpoint, or a ``(host, port)`` pair for a stdlib socket. A port in use
    (EADDRINUSE) or forbidden (EACCES) is skipped; any other error is
    raised. Raises BindError naming ``what`` when no port in the range is free.
    """
    import random  # only on this path

    lower, upper = port_range
    for port in random.sample(range(lower, upper + 1), upper - lower + 1):
        try:
            sock.bind(url(port))
        except (zmq.ZMQError, OSError) as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue
            raise
        return port
    raise BindError(f"cannot bind {what}: no free port in the port range {lower}..{upper}")


def _bind_random_ipc(sock: zmq.Socket[bytes], conn: ConnectionInfo) -> int:
    import os

    for n in range(1, 65536):
        path = f"{conn.ip}-{n}"
        if not os.path.exists(path):
            sock.bind(f"ipc://{path}")
            return n
    raise BindError("no free ipc path")  # pragma: no cover


class TrioSocket:
    """Drive one ZeroMQ socket from tasks of one trio run.

    ``ZMQ_FD`` signals only that the socket has commands to process, and any
    call that processes them — a recv, reading ``ZMQ_EVENTS``, a send when
    libzmq's command throttle lets it — resets the FD although a message
    may be queued (zmq_getsockopt(3), "ZMQ_FD"). So: the one reader tries a
    non-blocking recv before it waits on the FD, and every send and every
    :meth:`recv_multipart_nowait` re-checks ``ZMQ_EVENTS`` afterwards and
    wakes a waiting reader if a message is queued.

    Cancellation: :meth:`recv_multipart` checkpoints *before* it takes a
    message off the socket, never after, so a receive cancelled while it
    waits, or at its checkpoint with a message queued, loses nothing; a
    flood still yields to the run's other tasks at every message.

    Drops are visible: the kernel's ROUTERs are created with
    ``ROUTER_MANDATORY`` (create_and_bind), so a reply to a peer that is gone
    or past its high-water mark raises instead of vanishing; it is counted in
    ``dropped`` and logged (at most one line per DROP_LOG_INTERVAL).

    Threads: only tasks (or ``run_sync_soon`` callbacks) of the run that
    owns the socket may call it, except :meth:`send_from_thread`. One task
    at a time may await :meth:`recv_multipart`; any task may call
    :meth:`send_nowait` and :meth:`recv_multipart_nowait`, also while the
    reader waits. Every libzmq call on the socket is made under one lock,
    so :meth:`send_from_thread` (the shell's replies, sent by the thread
    that ran the request: core/kernelcore.py, "Replies") never touches the socket
    at the same time as the owning run; a lock is the full memory barrier
    libzmq asks of a socket used from more than one thread (zmq(7)).

    Why not zmq-anyio (0.4.1, measured in tests/test_sockets.py, which runs
    the same tests on both, and bench/sockets.py): it handles the FD edge
    after sends, but a cancelled ``await arecv_multipart()`` leaves its
    future queued to swallow the next message, a receive cancelled at
    trio's checkpoint drops the message it already took, and a DONTWAIT
    receive beside a waiting one leaves the waiter asleep over a queued
    message; it costs about 3x this class's CPU in a ping-pong (2.7-3.7x
    over three runs), and it pins pyzmq<28. docs/design.md, "Sockets", has
    the figures.
    """

    def __init__(self, sock: zmq.Socket[Any], name: str):
        self.sock = sock
        self.name = name
        self.fd = int(sock.getsockopt(zmq.FD))
        self.dropped = 0  #: replies that could not be routed (peer gone or past its HWM)
        self._last_drop_log = -DROP_LOG_INTERVAL
        self._waiter: Any = None  # the reader's trio.CancelScope while it waits
        self._lock = threading.Lock()  # around every libzmq call (send_from_thread)
        #: called (in the trio run) each time the reader is woken by the
        #: socket, before it receives, and when that wake-up brought no
        #: message (a peer connecting or leaving, ZMQ_FD's edge after a
        #: send): the control socket shortens the thread switch interval
        #: for the request, and puts it back if none came (switchinterval.py)
        self.on_wake: Callable[[], None] | None = None
        self.on_empty_wake: Callable[[], None] | None = None

    async def recv_multipart(self) -> list[Received]:
        """Wait for and return the next message's frames (a checkpoint).

        Frames up to :data:`COPY_THRESHOLD` bytes are ``bytes``; a longer
        one is a ``memoryview`` of libzmq's buffer (no copy), which lives
        as long as the view does: the caller drops its list to free them.
        """
        import trio

        await trio.lowlevel.checkpoint()
        woken = False
        while True:
            scope = trio.CancelScope()
            with self._lock:  # the try and the waiter together: a send_from_thread sees the waiter
                try:
                    return _received(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    pass
                self._waiter = scope
            if woken and self.on_empty_wake is not None:
                self.on_empty_wake()
            with scope:
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                finally:
                    with self._lock:
                        self._waiter = None
                woken = True
                if self.on_wake is not None:
                    self.on_wake()

    def recv_multipart_nowait(self) -> list[Received] | None:
        """The next message's frames if one is queued, else None (no
        checkpoint); frames as :meth:`recv_multipart` returns them.

        Any task of the run may call it, also while another task waits in
        :meth:`recv_multipart`: that reader is woken if more is queued."""
        with self._lock:
            try:
                return _received(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                return None
            finally:
                self._wake_reader()

    def send_nowait(self, frames: list[bytes], *, quiet: bool = False) -> bool:
        """Send without blocking; returns False (counted, logged) when a
        ROUTER cannot route the message: the peer is gone or not connected
        yet (EHOSTUNREACH) or past its high-water mark (EAGAIN). ``quiet``:
        neither counted nor logged, for a caller that tries again."""
        with self._lock:
            try:
                return self._send_locked(frames, quiet)
            finally:
                self._wake_reader()

    def send_from_thread(self, frames: list[bytes], token: Any) -> bool:
        """:meth:`send_nowait` from a thread that does not own the socket.

        ``token``: the owning run's ``TrioToken``. The send can reset
        ``ZMQ_FD`` over a queued message (class docstring); then the waiting
        reader is woken through ``token`` (a wake-up only in that case).
        Returns what :meth:`send_nowait` returns; raises ``zmq.ZMQError``
        for anything else (a closed socket). Any thread.
        """
        with self._lock:
            try:
                return self._send_locked(frames, False)
            finally:
                if self._waiter is not None and int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    token.run_sync_soon(self._wake_reader_now)

    def _wake_reader_now(self) -> None:
        """In the owning run: wake the reader if it waits (it tries a recv first)."""
        with self._lock:
            if self._waiter is not None:
                self._waiter.cancel()

    def _send_locked(self, frames: list[bytes], quiet: bool) -> bool:
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EAGAIN, zmq.EHOSTUNREACH):
                raise
            if quiet:
                return False
            self.dropped += 1
            now = time.monotonic()
            if now - self._last_drop_log >= DROP_LOG_INTERVAL:
                self._last_drop_log = now
                why = "peer past its high-water mark" if exc.errno == zmq.EAGAIN else "peer is gone"
                log.warning(
                    "%s: a message could not be delivered (%s); %d dropped so far", self.name, why, self.dropped
                )
            return False

    def _wake_reader(self) -> None:
        # (lock held) a send or recv may have processed the socket's commands and so
        # reset ZMQ_FD while a message is queued: a waiting reader would sleep
        if self._waiter is not None and int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._waiter.cancel()


def _received(frames: list[zmq.Frame]) -> list[Received]:
    """Short frames as bytes (``Frame.bytes``: one small copy, and the
    libzmq message is freed with the Frame), long ones as views of libzmq's
    buffer (no copy)."""
    return [f.bytes if len(f) <= COPY_THRESHOLD else f.buffer for f in frames]
