"""JEP 66 start-up handshake, pure: registration-file parsing and both wire dialects.

Bytes and dicts in, bytes and dataclasses out; shared by the kernel side
(its one blocking registration call is ``trikernel.server.registration``)
and by the launcher in ``trikernel.launch.provisioner``.

The two dialects (see ``handshake.md`` in the design notes; jupyter_client
docs/kernels.rst "Connection files" and docs/messaging.rst "Kernel startup
handshake"; JEP 66):

- **J** (jupyter_client docs, xeus 6 / xeus-zmq 4). Kernel DEALER sends
  ``[b"<IDS|MSG>", hmac_hex(content), content]`` with content
  ``{"kernel_id", "shell_port", ...}`` (ports as strings). The launcher
  (ROUTER) answers with one signed frame ``[b"<IDS|MSG>", hmac, content]``;
  the content is free-form (xeus sends ``ACK``). The HMAC covers the content
  frame only.
- **P** (Posit ark / kallichore). Kernel sends, as REQ (here: a DEALER with
  a leading empty frame), a full signed Jupyter message of type
  ``handshake_request`` whose content holds the five ports as integers. The
  launcher (REP) answers with a signed ``handshake_reply`` whose content is
  ``{"status": "ok"}`` or ``{"status": "error", "error": "..."}``. An
  unsigned reply (kallichore answers parse failures with raw JSON) is a
  failure.

Dialect rule: ``kernel_id`` or ``registration_ip`` in the registration file
means J, otherwise P.

Runs on: any thread (pure: bytes and dicts in, bytes and dataclasses
out); the kernel uses it on the main thread at start-up, the provisioner
in the client's process.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trikernel.errors import ConfigError, HandshakeError, ProtocolError
from trikernel.protocol.channels import PORT_FIELDS
from trikernel.protocol.connection import Security, check_port, check_security
from trikernel.protocol.wire import (
    DELIM,
    Message,
    Signer,
    deserialize,
    dumps,
    loads,
    new_header,
    serialize,
    split_identities,
)

log = logging.getLogger("trikernel.handshake")

#: The five channel port names, in the order the spec lists them (channels.py).
PORT_NAMES: tuple[str, ...] = PORT_FIELDS
#: Seconds the kernel waits for the launcher's acknowledgement by default.
DEFAULT_TIMEOUT = 5.0
#: Address the kernel binds when the registration file names none.
DEFAULT_BIND_IP = "127.0.0.1"
#: Dialect P message types (kallichore's handshake protocol).
HANDSHAKE_REQUEST = "handshake_request"
HANDSHAKE_REPLY = "handshake_reply"
#: At most this many characters of an unparseable reply go into an error message.
_SNIPPET = 200


class Dialect(StrEnum):
    """Wire dialect of a registration (see module docstring)."""

    J = "J"  # jupyter_client docs / xeus: short form, DEALER -> ROUTER
    P = "P"  # ark / kallichore: full handshake_request message, REQ -> REP


@dataclass(frozen=True, slots=True)
class RegistrationInfo:
    """What the kernel needs from a registration file.

    - ``dialect``: :class:`Dialect` to speak.
    - ``registration_ip`` / ``registration_port`` / ``transport``: the
      launcher's registration socket (``transport`` is always "tcp" today).
    - ``kernel_id``: to echo back (dialect J), ``None`` in dialect P.
    - ``security``: the HMAC key and scheme and the CurveZMQ pair, checked
      as in a connection file (:class:`~trikernel.protocol.connection.Security`;
      the key may be empty: unsigned).
    - ``bind_ip``: address on which the kernel binds its five channels.
    """

    dialect: Dialect
    registration_ip: str
    registration_port: int
    transport: str
    kernel_id: str | None
    security: Security
    bind_ip: str = DEFAULT_BIND_IP

    @property
    def registration_url(self) -> str:
        """ZeroMQ endpoint of the registration socket, e.g. ``tcp://127.0.0.1:5555``."""
        host = f"[{self.registration_ip}]" if ":" in self.registration_ip else self.registration_ip
        return f"{self.transport}://{host}:{self.registration_port}"

    def __repr__(self) -> str:  # never print the key
        return (
            f"RegistrationInfo(dialect={self.dialect.value!r}, registration_url={self.registration_url!r}, "
            f"kernel_id={self.kernel_id!r}, bind_ip={self.bind_ip!r}, "
            f"signature_scheme={self.security.signature_scheme!r}, "
            f"curve={'on' if self.security.curve_secretkey else 'off'})"
        )


@dataclass(frozen=True, slots=True)
class KernelRegistration:
    """A registration as the launcher received it (launcher side).

    - ``dialect``: the dialect it arrived in; reply in the same one.
    - ``ports``: the five ``*_port`` names -> int.
    - ``kernel_id``: as sent (dialect J; dialect P only if the kernel added it).
    - ``request_header``: header of the dialect P ``handshake_request`` (the
      reply's parent), empty for dialect J.
    """

    dialect: Dialect
    ports: dict[str, int]
    kernel_id: str | None = None
    request_header: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Registration file
# ---------------------------------------------------------------------------


def is_registration_file(d: Mapping[str, Any]) -> bool:
    """True iff ``d`` (a parsed ``-f`` file) is a JEP 66 registration file.

    That is the case exactly when it has a ``registration_port`` field.
    """
    return "registration_port" in d


def detect_dialect(d: Mapping[str, Any]) -> Dialect:
    """Dialect J if ``kernel_id`` or ``registration_ip`` is present, else P (handshake.md)."""
    return Dialect.J if ("kernel_id" in d or "registration_ip" in d) else Dialect.P


def bind_ip(d: Mapping[str, Any]) -> str:
    """Address the kernel binds: ``ip``, else ``registration_ip``, else 127.0.0.1.

    Empty strings count as absent. Raises ConfigError if the chosen field is
    not a string.
    """
    for name in ("ip", "registration_ip"):
        value = d.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string address, got {type(value).__name__}")
        return "0.0.0.0" if value == "*" else value
    return DEFAULT_BIND_IP


def _port(value: Any, name: str, *, allow_zero: bool = False) -> int:
    """A port given as int or decimal string; ConfigError names ``name``."""
    return check_port(value, name, allow_zero=allow_zero, allow_str=True)


def parse_registration(d: Mapping[str, Any]) -> RegistrationInfo:
    """Parse a registration file dict (jupyter_client docs/kernels.rst; handshake.md).

    Accepts ``registration_port`` as number or string. Raises ConfigError
    naming the field for: a missing/invalid ``registration_port``, a
    transport other than "tcp", a non-string ``key``/``kernel_id``/address,
    an unknown ``signature_scheme``, or only one of the two curve keys.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"registration file: expected a JSON object, got {type(d).__name__}")
    if "registration_port" not in d:
        raise ConfigError("registration_port: missing (not a registration file)")
    port = _port(d["registration_port"], "registration_port")

    transport = d.get("transport", "tcp")
    if transport != "tcp":
        raise ConfigError(f"transport: only 'tcp' is supported for the handshake, got {transport!r}")

    dialect = detect_dialect(d)
    address = bind_ip(d)
    reg_ip = d.get("registration_ip") or d.get("ip") or DEFAULT_BIND_IP
    if not isinstance(reg_ip, str):
        raise ConfigError(f"registration_ip: expected a string address, got {type(reg_ip).__name__}")
    if reg_ip in ("*", "0.0.0.0"):
        # the launcher bound a wildcard; from the kernel's side that is the local host
        reg_ip = DEFAULT_BIND_IP

    kernel_id = d.get("kernel_id")
    if kernel_id is not None and not isinstance(kernel_id, str):
        raise ConfigError(f"kernel_id: expected a string, got {type(kernel_id).__name__}")

    return RegistrationInfo(
        dialect=dialect,
        registration_ip=reg_ip,
        registration_port=port,
        transport="tcp",
        kernel_id=kernel_id,
        security=check_security(d, require_key=False),
        bind_ip=address,
    )


def _check_ports(ports: Mapping[str, Any], *, where: str) -> dict[str, int]:
    """Validate the five channel ports (int or decimal string) -> dict of int."""
    out: dict[str, int] = {}
    for name in PORT_NAMES:
        if name not in ports:
            raise ProtocolError(f"{where}: {name} missing")
        try:
            out[name] = _port(ports[name], name)
        except ConfigError as exc:
            raise ProtocolError(f"{where}: {exc}") from None
    return out


# ---------------------------------------------------------------------------
# Dialect J payloads
# ---------------------------------------------------------------------------


def build_registration_j(kernel_id: str | None, ports: Mapping[str, int], signer: Signer) -> list[bytes]:
    """Kernel -> launcher, dialect J: ``[DELIM, hmac_hex(content), content]``.

    ``content`` is JSON ``{"kernel_id", "shell_port", ...}`` with the ports as
    decimal strings (as xeus sends them). ``kernel_id`` None is sent as "".
    Raises ProtocolError if a port is missing or invalid.
    """
    checked = _check_ports(ports, where="ports")
    content: dict[str, Any] = {"kernel_id": kernel_id or ""}
    content.update({name: str(checked[name]) for name in PORT_NAMES})
    body = dumps(content)
    return [DELIM, signer.sign([body]), body]


def build_ack_j(signer: Signer, *, error: str | None = None) -> list[bytes]:
    """Launcher -> kernel, dialect J: ``[DELIM, hmac_hex(content), content]``.

    Content is JSON ``{"status": "ok"}`` or ``{"status": "error", "error": ...}``
    (the spec leaves it free-form; xeus kernels only check the signature).
    """
    content: dict[str, Any] = {"status": "ok"} if error is None else {"status": "error", "error": error}
    body = dumps(content)
    return [DELIM, signer.sign([body]), body]


# ---------------------------------------------------------------------------
# Dialect P payloads
# ---------------------------------------------------------------------------


def build_request_p(
    ports: Mapping[str, int], signer: Signer, *, session: str | None = None, kernel_id: str | None = None
) -> list[bytes]:
    """Kernel -> launcher, dialect P: a full signed ``handshake_request``.

    Frames: ``[DELIM, sig, header, parent_header, metadata, content]``;
    content = the five ports as integers (plus ``kernel_id`` when given).
    A REQ peer adds its own empty frame; a DEALER must prepend ``b""``.
    Raises ProtocolError if a port is missing or invalid.
    """
    content: dict[str, Any] = dict(_check_ports(ports, where="ports"))
    if kernel_id:
        content["kernel_id"] = kernel_id
    header = new_header(HANDSHAKE_REQUEST, session or uuid.uuid4().hex)
    return serialize(Message(header=header, content=content), signer)


def build_reply_p(signer: Signer, request_header: Mapping[str, Any], *, error: str | None = None) -> list[bytes]:
    """Launcher -> kernel, dialect P: a signed ``handshake_reply``.

    Content ``{"status": "ok"}`` or ``{"status": "error", "error": error}``;
    parent header = the request's header. Frames start at DELIM.
    """
    session = str(request_header.get("session") or uuid.uuid4().hex)
    header = new_header(HANDSHAKE_REPLY, session, username="launcher")
    content: dict[str, Any] = {"status": "ok"} if error is None else {"status": "error", "error": error}
    return serialize(Message(header=header, parent_header=dict(request_header), content=content), signer)


# ---------------------------------------------------------------------------
# Launcher side: parse what a kernel sent
# ---------------------------------------------------------------------------


def parse_registration_frames(frames: Sequence[bytes], signer: Signer) -> tuple[list[bytes], KernelRegistration]:
    """Parse one registration as a ROUTER receives it (launcher side).

    ``frames``: everything the ROUTER returned, routing identity first.
    Returns ``(prefix, registration)`` where ``prefix`` is the frames before
    ``<IDS|MSG>`` (identity, plus the empty frame a REQ adds); send a reply
    as ``prefix + build_ack_j(...)`` / ``prefix + build_reply_p(...)``.
    More than four frames after the delimiter = a full message (dialect P),
    else the short form (dialect J). Raises ProtocolError for: no delimiter,
    bad/missing signature, bad JSON, a wrong ``msg_type``, bad ports.
    """
    prefix, rest = split_identities(frames)
    if len(rest) > 4:
        msg = deserialize([DELIM, *rest], signer)
        if msg.msg_type != HANDSHAKE_REQUEST:
            raise ProtocolError(f"expected msg_type {HANDSHAKE_REQUEST!r}, got {msg.msg_type!r}")
        ports = _check_ports(msg.content, where="handshake_request content")
        kid = msg.content.get("kernel_id")
        return prefix, KernelRegistration(
            Dialect.P, ports, kid if isinstance(kid, str) and kid else None, dict(msg.header)
        )
    if len(rest) != 2:
        raise ProtocolError(f"registration: expected 2 frames after <IDS|MSG> (short form), got {len(rest)}")
    sig, body = rest
    signer.verify(sig, [body])
    content = loads(body)
    if not isinstance(content, dict):
        raise ProtocolError("registration content is not a JSON object")
    ports = _check_ports(content, where="registration content")
    kid = content.get("kernel_id")
    return prefix, KernelRegistration(Dialect.J, ports, kid if isinstance(kid, str) and kid else None)


# ---------------------------------------------------------------------------
# Kernel side: parse the launcher's acknowledgement
# ---------------------------------------------------------------------------


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def _snippet(frames: Sequence[bytes]) -> str:
    text = b" | ".join(bytes(f) for f in frames).decode("utf-8", "replace")
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."


def parse_ack(frames: Sequence[bytes], signer: Signer, dialect: Dialect) -> dict[str, Any]:
    """Check the launcher's acknowledgement (kernel side); return its content.

    Accepts the short form ``[DELIM, sig, content]`` (dialect J: content
    free-form; a JSON object with ``"status": "error"`` is a refusal) and a
    full signed message (``handshake_reply``; dialect P requires
    ``"status": "ok"``). Leading frames before DELIM are ignored.
    Raises HandshakeError for: no delimiter (e.g. kallichore's unsigned
    JSON error), unsigned or badly signed reply, a malformed reply, or an
    error status. A non-JSON J ack (xeus's ``ACK``) returns ``{}``.
    """
    try:
        _, rest = split_identities(frames)
    except ProtocolError:
        raise HandshakeError(f"launcher sent an unparseable/unsigned reply: {_snippet(frames)!r}") from None
    try:
        if len(rest) > 4:
            msg = deserialize([DELIM, *rest], signer)
            content = msg.content
            if dialect is Dialect.P and msg.msg_type != HANDSHAKE_REPLY:
                raise HandshakeError(f"launcher replied with msg_type {msg.msg_type!r}, expected {HANDSHAKE_REPLY!r}")
        elif len(rest) == 2:
            sig, body = rest
            signer.verify(sig, [body])
            try:
                parsed = loads(body)
            except ProtocolError:
                parsed = None
            if dialect is Dialect.P and not isinstance(parsed, dict):
                raise HandshakeError("launcher reply content is not a JSON object")
            content = parsed if isinstance(parsed, dict) else {}
        else:
            raise HandshakeError(f"launcher reply has {len(rest)} frames after <IDS|MSG>; expected 2 or >= 5")
    except ProtocolError as exc:
        raise HandshakeError(f"launcher reply rejected: {exc}") from None
    status = content.get("status")
    if status == "error" or (dialect is Dialect.P and status != "ok"):
        detail = content.get("error") or content.get("evalue") or "no detail"
        text = detail if isinstance(detail, str) else repr(detail)
        text = text.replace("\n", " ")  # one line, bounded, whatever the launcher sent
        text = text if len(text) <= _SNIPPET else text[:_SNIPPET] + "..."
        raise HandshakeError(f"launcher refused the registration (status={_short(status)}): {text}")
    return content


def build_registration(reg: RegistrationInfo, ports: Mapping[str, int], signer: Signer) -> list[bytes]:
    """The frames the kernel's registration (server/registration.py) sends
    for ``reg.dialect`` (dialect P starts with ``b""``)."""
    if reg.dialect is Dialect.J:
        return build_registration_j(reg.kernel_id, ports, signer)
    return [b"", *build_request_p(ports, signer, kernel_id=reg.kernel_id)]
