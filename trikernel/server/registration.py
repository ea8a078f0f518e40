"""The kernel's JEP 66 registration: its one blocking call to the launcher.

Runs on: the main thread, once, after all five channels are bound and
before IPython is imported (launch/cli.py). It owns one short-lived pyzmq
context and one DEALER socket, which it creates, uses and closes before it
returns or raises. The payloads are ``trikernel.protocol.handshake`` (pure);
the wire contract is docs/handshake.md.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import zmq

from trikernel.errors import HandshakeError, ProtocolError
from trikernel.protocol.handshake import DEFAULT_TIMEOUT, build_registration, parse_ack

if TYPE_CHECKING:
    from trikernel.protocol.handshake import RegistrationInfo
    from trikernel.protocol.wire import Signer

log = logging.getLogger("trikernel.handshake")


def register(
    reg: RegistrationInfo,
    ports: dict[str, int],
    signer: Signer,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Report our five ports to the launcher and wait for its acknowledgement.

    Blocking; call from the main thread after all five channels are bound
    and before slow initialisation (JEP 66; handshake.md "Both").
    ``ports``: ``{"shell_port", "iopub_port", "stdin_port", "control_port",
    "hb_port"}`` -> int. ``timeout``: seconds to wait for the ack (> 0).
    Uses its own pyzmq context and one DEALER socket (dialect P: a leading
    empty frame, REQ-compatible), always closed (linger 0) on return.

    Raises HandshakeError on: no acknowledgement within ``timeout``; an
    unsigned, badly signed or unparseable reply; an error status; an
    invalid port in ``ports``; a failure to connect.
    """
    if not timeout > 0:
        raise HandshakeError(f"handshake timeout must be > 0 seconds, got {timeout!r}")
    try:
        frames = build_registration(reg, ports, signer)
    except ProtocolError as exc:
        raise HandshakeError(f"cannot register: {exc}") from None

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if reg.security.curve_secretkey:
            # The registration socket itself is not encrypted in either dialect;
            # curve keys only apply to the five channels.
            log.debug("curve keys present; registration socket stays plain (JEP 66)")
        try:
            sock.connect(reg.registration_url)
        except zmq.ZMQError as exc:
            raise HandshakeError(f"cannot connect to registration socket {reg.registration_url}: {exc}") from None
        log.debug("registering with %s (dialect %s)", reg.registration_url, reg.dialect.value)
        deadline = time.monotonic() + timeout
        try:
            # A DEALER queues the message until the TCP connection is up; a
            # non-blocking send fails only if the pipe cannot take it at all.
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            if not sock.poll(int(timeout * 1000), zmq.POLLOUT):
                raise HandshakeError(
                    f"could not send registration to {reg.registration_url} within {timeout:g} s"
                ) from None
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        if not sock.poll(remaining_ms, zmq.POLLIN):
            raise HandshakeError(
                f"no acknowledgement from the launcher at {reg.registration_url} within {timeout:g} s "
                f"(dialect {reg.dialect.value})"
            )
        reply = sock.recv_multipart(flags=zmq.NOBLOCK)
        parse_ack(reply, signer, reg.dialect)
        log.debug("launcher acknowledged the registration")
    finally:
        sock.close(linger=0)
        ctx.term()
