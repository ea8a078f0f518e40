"""The gateway launcher protocol of gateway_provisioners 0.5 and Enterprise Gateway 3.3, pure.

What a launcher and the server agree on (GP ``kernel-launchers/shared/
scripts/server_listener.py``, ``response_manager.py``; EG
``etc/kernel-launchers/python/scripts/launch_ipykernel.py``): the flags'
values (port range, response address, transport-encryption policy), the
v1 payload sent to the response address (base64 of JSON ``{"version": 1,
"key": K, "conn_info": C}``, K the AES key wrapped with the server's RSA key,
C the connection info under AES-128-ECB), and the comm-port requests
(``{"signum": N}``, ``{"shutdown": 1}``). ``python -m trikernel
gateway-launch`` (launch/gateway.py) and the comm-port server
(server/commport.py) use it; docs/gateway.md tells the whole story.

Runs on: any thread (pure: strings, bytes and dicts in and out;
``cryptography`` is imported only by the payload functions).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trikernel.errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

    from trikernel.protocol.connection import ConnectionInfo

#: The payload version GP 0.5.0 and EG 3.3.0 launchers send and servers accept.
LAUNCHER_VERSION = 1
#: A placeholder the server did not substitute, e.g. ``{transport_encryption}`` from EG 3.3.0.
_PLACEHOLDER = re.compile(r"^\{[A-Za-z0-9_]+\}$")
#: Transport-encryption policies that ask for CurveZMQ keys.
ENCRYPTION_POLICIES = ("auto", "required")


@dataclass(frozen=True, slots=True)
class CommRequest:
    """One comm-port request: ``signum`` (None if absent) and ``shutdown``."""

    signum: int | None
    shutdown: bool


def is_placeholder(value: str | None) -> bool:
    """True for an argv placeholder the server left unsubstituted, e.g. ``{port_range}``."""
    return value is not None and bool(_PLACEHOLDER.match(value.strip()))


def parse_port_range(value: str | None, *, name: str = "--port-range") -> tuple[int, int] | None:
    """``"L..U"`` -> ``(L, U)``; None for "any port".

    Any port: absent, empty, an unsubstituted placeholder, or a range of
    size zero (``0..0``, ``N..N``: GP's "port-range enforcement disabled").
    Raises ConfigError naming ``name`` for a malformed range, ports outside
    1..65535, or L > U. The range size is the server's to police (GP and
    EG require at least 1000 ports); any non-empty range works here.
    """
    if value is None or not value.strip() or is_placeholder(value):
        return None
    parts = value.strip().split("..")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"{name}: expected LOWER..UPPER (e.g. 40000..41000 or 0..0), got {value!r}")
    lower, upper = (int(p) for p in parts)
    if lower == upper:
        return None
    if lower > upper:
        raise ConfigError(f"{name}: lower port {lower} is above upper port {upper}")
    if lower < 1 or upper > 65535:
        raise ConfigError(f"{name}: ports must be in 1..65535, got {value!r}")
    return lower, upper


def parse_response_address(value: str | None, *, name: str = "--response-address") -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) -> ``(host, port)``; ConfigError naming ``name``."""
    if value is None or not value.strip():
        raise ConfigError(f"{name}: missing (the server passes it as {{response_address}})")
    if is_placeholder(value):
        raise ConfigError(f"{name}: got the unsubstituted placeholder {value!r}; is a gateway provisioner launching?")
    host, sep, port = value.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{name}: expected HOST:PORT, got {value!r}")
    return host, int(port)


def parse_transport_encryption(value: str | None, *, name: str = "--transport-encryption") -> str | None:
    """The policy: "auto" or "required" (CurveZMQ keys wanted), or None.

    None for: absent, empty (GP substitutes "" when encryption is off),
    "disabled", or an unsubstituted ``{transport_encryption}`` (EG 3.3.0 and
    older GP do not know it). Case-insensitive. Raises ConfigError naming
    ``name`` for any other value (a policy that is not understood must not
    silently fall back to plaintext).
    """
    if value is None or is_placeholder(value):
        return None
    policy = value.strip().lower()
    if policy in ("", "disabled"):
        return None
    if policy not in ENCRYPTION_POLICIES:
        raise ConfigError(f"{name}: expected auto, required or disabled, got {value!r}")
    return policy


def _crypto_missing() -> ConfigError:
    return ConfigError(
        "--public-key: encrypting the connection info needs the 'cryptography' package "
        "(pip install 'trikernel[gateway]')"
    )


def load_public_key(value: str, *, name: str = "--public-key") -> RSAPublicKey:
    """The server's RSA public key from base64 DER (SubjectPublicKeyInfo, as GP/EG send
    it: a PEM body without header lines) or a whole PEM. ConfigError naming ``name``."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
    except ImportError:
        raise _crypto_missing() from None
    text = value.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode("".join(text.split()), validate=True))
    except ValueError:
        raise ConfigError(f"{name}: not a base64-encoded RSA public key") from None
    if not isinstance(key, RSAPublicKey):
        raise ConfigError(f"{name}: not an RSA public key ({type(key).__name__})")
    return key


def connection_info(conn: ConnectionInfo, *, kernel_id: str, comm_port: int, pid: int, pgid: int) -> dict[str, Any]:
    """The ``conn_info`` dict of a v1 payload: the connection file fields
    (:meth:`ConnectionInfo.to_dict`, key as str, curve keys when set) plus
    ``pid``, ``pgid``, ``comm_port`` and ``kernel_id``."""
    info = conn.to_dict()
    info.update(pid=pid, pgid=pgid, comm_port=comm_port, kernel_id=kernel_id)
    return info


def build_payload(
    conn_info: Mapping[str, Any], public_key: RSAPublicKey | str, *, version: int = LAUNCHER_VERSION
) -> bytes:
    """The bytes a launcher sends to the response address (module docstring, "payload").

    ``conn_info``: JSON-serialisable (see :func:`connection_info`).
    ``public_key``: the server's key, loaded or as :func:`load_public_key` takes it.
    ``version``: the payload's version field (tests send others to see them refused).
    A fresh random AES key per call. Raises ConfigError if ``cryptography``
    is missing or the key is bad.
    """
    try:
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise _crypto_missing() from None
    key = load_public_key(public_key) if isinstance(public_key, str) else public_key
    aes_key = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    plain = padder.update(json.dumps(conn_info).encode("utf-8")) + padder.finalize()
    # ECB because the protocol says so (GP/EG decrypt with AES.MODE_ECB); one
    # key per payload, and the RSA-wrapped key is the secret that matters.
    encryptor = Cipher(algorithms.AES(aes_key), modes.ECB()).encryptor()
    sealed = encryptor.update(plain) + encryptor.finalize()
    payload = {
        "version": version,
        "key": base64.b64encode(key.encrypt(aes_key, PKCS1v15())).decode(),
        "conn_info": base64.b64encode(sealed).decode(),
    }
    return base64.b64encode(json.dumps(payload).encode("utf-8"))


def parse_comm_request(data: bytes) -> CommRequest:
    """Parse what one comm-port connection sent: one JSON object.

    ``signum``: an int or decimal string in 0..127 (the stock listeners
    ``int()`` it); ``shutdown``: any JSON value, true when truthy (the stock
    listeners ``bool()`` it). Other keys are ignored. Raises ProtocolError
    for non-UTF-8 or non-JSON data, a non-object, a bad ``signum``, or an
    object with neither key.
    """
    try:
        request = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"not a JSON object: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError(f"expected a JSON object, got {type(request).__name__}")
    if "signum" not in request and "shutdown" not in request:
        raise ProtocolError(f"neither 'signum' nor 'shutdown' in request (keys: {sorted(request)[:5]})")
    signum = request.get("signum")
    if signum is not None:
        if isinstance(signum, str) and signum.strip().isdigit():
            signum = int(signum)
        if isinstance(signum, bool) or not isinstance(signum, int) or not 0 <= signum <= 127:
            raise ProtocolError(f"'signum' must be a signal number 0..127, got {request.get('signum')!r}")
    return CommRequest(signum=signum, shutdown=bool(request.get("shutdown")))
