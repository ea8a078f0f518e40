"""The connection file: where and how the kernel listens, and its security fields.

Reads and validates connection files (jupyter_client docs/kernels.rst,
"Connection files"; CurveZMQ keys as provisioned by jupyter_client 8.10)
and registration files' security fields (one validator for both), and
writes them atomically with mode 0600.

Runs on: any thread (pure: no zmq, no trio).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from trikernel.errors import ConfigError
from trikernel.protocol.channels import PORT_FIELDS
from trikernel.protocol.wire import Signer


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Where and how the kernel listens.

    Ports: ints in [0, 65535]; 0 means "bind a random port". ``key`` is the
    HMAC key as bytes (empty disables signing). Curve keys are Z85 bytes
    (40 chars) or None.
    """

    ip: str = "127.0.0.1"
    transport: str = "tcp"
    shell_port: int = 0
    iopub_port: int = 0
    stdin_port: int = 0
    control_port: int = 0
    hb_port: int = 0
    key: bytes = b""
    signature_scheme: str = "hmac-sha256"
    kernel_name: str = ""
    curve_publickey: bytes | None = None
    curve_secretkey: bytes | None = None

    def port(self, channel: str) -> int:
        """The port of ``channel`` ("shell", "iopub", "stdin", "control" or "hb"), its
        ``<channel>_port`` field; 0 means "bind a random port". Raises AttributeError for a
        name that is no channel."""
        return int(getattr(self, f"{channel}_port"))

    @property
    def ports(self) -> dict[str, int]:
        """``{"shell_port": n, ...}`` for all five channels."""
        return {f: int(getattr(self, f)) for f in PORT_FIELDS}

    @property
    def all_ports_given(self) -> bool:
        """Whether all five ports are set (> 0), i.e. nothing is left to bind randomly."""
        return all(p > 0 for p in self.ports.values())

    @property
    def curve(self) -> bool:
        """Whether CurveZMQ transport encryption is on: the file gave the server's secret key
        (jupyter_client 8.10's ``curve_secretkey``)."""
        return self.curve_secretkey is not None

    def with_ports(self, ports: dict[str, int]) -> ConnectionInfo:
        """A copy with the ports in ``ports`` (``{"shell_port": n, ...}``, e.g. the ports the
        sockets were bound to) put in; keys that are no port field are ignored."""
        changes: dict[str, Any] = {k: int(v) for k, v in ports.items() if k in PORT_FIELDS}
        return replace(self, **changes)

    def url(self, channel: str, port: int | None = None) -> str:
        """The ZeroMQ endpoint of ``channel`` (at ``port`` if given, else the channel's own
        port): ``tcp://ip:port``, or ``ipc://ip-port`` for transport "ipc", as jupyter_client
        spells it (kernels.rst "Connection files")."""
        p = self.port(channel) if port is None else port
        if self.transport == "ipc":
            return f"ipc://{self.ip}-{p}"
        return f"tcp://{self.ip}:{p}"

    def to_dict(self) -> dict[str, Any]:
        """The connection-file JSON shape (key as str)."""
        d: dict[str, Any] = {
            **self.ports,
            "ip": self.ip,
            "transport": self.transport,
            "key": self.key.decode(),
            "signature_scheme": self.signature_scheme,
            "kernel_name": self.kernel_name,
        }
        if self.curve_publickey is not None and self.curve_secretkey is not None:
            d["curve_publickey"] = self.curve_publickey.decode()
            d["curve_secretkey"] = self.curve_secretkey.decode()
        return d


def _field(d: Mapping[str, Any], name: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in d or d[name] is None:
        if default is ...:
            raise ConfigError(f"{name}: required field is missing")
        return default
    value = d[name]
    if not isinstance(value, types) or isinstance(value, bool):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{name}: must be {want}, got {type(value).__name__}")
    return value


def check_port(value: Any, name: str, *, allow_zero: bool = True, allow_str: bool = False) -> int:
    """A port number in 0..65535 (1..65535 without ``allow_zero``).

    ``allow_str`` also accepts a decimal string (xeus writes
    ``registration_port`` so). Raises ConfigError naming ``name``.
    """
    if isinstance(value, str) and allow_str and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        want = "an integer or a decimal string" if allow_str else "an integer"
        raise ConfigError(f"{name}: must be {want}, got {type(value).__name__} {value!r}")
    low = 0 if allow_zero else 1
    if not low <= value <= 65535:
        raise ConfigError(f"{name}: must be in {low}..65535, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Security:
    """The signing and encryption fields shared by connection and
    registration files: HMAC ``key`` (bytes; empty = unsigned),
    ``signature_scheme`` ("hmac-<hashlib name>"), CurveZMQ pair (40-char Z85
    bytes each, or both None)."""

    key: bytes
    signature_scheme: str
    curve_publickey: bytes | None
    curve_secretkey: bytes | None


#: The Z85 alphabet (ZeroMQ RFC 32), in which CurveZMQ keys are written.
_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def check_security(d: Mapping[str, Any], *, require_key: bool = True) -> Security:
    """Validate ``key``, ``signature_scheme`` and the CurveZMQ pair of a
    connection or registration file (jupyter_client docs/kernels.rst,
    "Connection files"; CurveZMQ keys as jupyter_client 8.10 provisions them).

    Raises ConfigError naming the field: ``key`` missing (unless
    ``require_key`` is false) or not a string, an unknown scheme, one curve
    key without the other, a curve key that is not 40 Z85 characters, a key that is no UTF-8.
    """
    key = _field(d, "key", str, ... if require_key else "")
    scheme = _field(d, "signature_scheme", str, "hmac-sha256")
    Signer(b"", scheme)  # raises ConfigError naming signature_scheme
    pub, sec = d.get("curve_publickey"), d.get("curve_secretkey")
    if (pub is None) != (sec is None):
        missing = "curve_secretkey" if sec is None else "curve_publickey"
        raise ConfigError(f"{missing}: missing (curve_publickey and curve_secretkey come together)")
    keys: list[bytes | None] = []
    for name, value in (("curve_publickey", pub), ("curve_secretkey", sec)):
        if value is not None and (not isinstance(value, str) or len(value) != 40 or not set(value) <= _Z85):
            raise ConfigError(f"{name}: must be a 40-character Z85 string (ZeroMQ's RFC 32 alphabet)")
        keys.append(value.encode() if value else None)
    try:
        raw_key = key.encode()
    except UnicodeEncodeError:
        raise ConfigError("key: not encodable as UTF-8 (a lone surrogate?)") from None
    return Security(raw_key, scheme, keys[0], keys[1])


def parse_connection(d: Any) -> ConnectionInfo:
    """Validate a decoded connection file.

    A missing or 0 ``*_port`` means "bind a random port" (mode B: the
    kernel writes the ports it bound back). Raises ConfigError naming the
    offending field (``"<field>: <problem>"``).
    """
    if not isinstance(d, Mapping):
        raise ConfigError("top level must be a JSON object")
    ports = {name: check_port(d.get(name, 0), name) for name in PORT_FIELDS}
    transport = _field(d, "transport", str, "tcp")
    if transport not in ("tcp", "ipc"):
        raise ConfigError(f"transport: must be 'tcp' or 'ipc', got {transport!r}")
    ip = _field(d, "ip", str, "127.0.0.1") or "127.0.0.1"
    sec = check_security(d)
    return ConnectionInfo(
        ip=ip,
        transport=transport,
        key=sec.key,
        signature_scheme=sec.signature_scheme,
        kernel_name=_field(d, "kernel_name", str, ""),
        curve_publickey=sec.curve_publickey,
        curve_secretkey=sec.curve_secretkey,
        **ports,
    )


def load_json_file(path: str) -> dict[str, Any]:
    """Read a JSON object from ``path``. Raises ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"connection file {path!r}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError(f"connection file {path!r}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"connection file {path!r}: top level must be a JSON object")
    return data


def write_json_atomic(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically, mode 0600 from the start.

    The temporary file (``mkstemp``: 0600, O_EXCL) sits beside ``path`` and
    is renamed over it, so the key is never readable by others and a reader
    never sees half a file. Raises OSError.
    """
    directory = os.path.dirname(os.path.abspath(path))
    import tempfile  # not on the start-up path unless ports are written back

    fd, tmp = tempfile.mkstemp(prefix=".trikernel-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(data), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
