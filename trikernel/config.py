"""Pure configuration values: the connection file and kernel tunables.

Reads and validates connection files (jupyter_client docs/kernels.rst,
"Connection files"; CurveZMQ keys as provisioned by jupyter_client 8.10) and
holds the named bounds of time and memory the kernel uses. No zmq, no trio.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigError
from .wire import DEFAULT_LIMITS, Signer, WireLimits

#: The five channels, in the order the spec lists their ports.
CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
PORT_FIELDS = tuple(f"{c}_port" for c in CHANNELS)


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
        return int(getattr(self, f"{channel}_port"))

    @property
    def ports(self) -> dict[str, int]:
        """``{"shell_port": n, ...}`` for all five channels."""
        return {f: int(getattr(self, f)) for f in PORT_FIELDS}

    @property
    def all_ports_given(self) -> bool:
        return all(p > 0 for p in self.ports.values())

    @property
    def curve(self) -> bool:
        return self.curve_secretkey is not None

    def with_ports(self, ports: dict[str, int]) -> ConnectionInfo:
        changes: dict[str, Any] = {k: int(v) for k, v in ports.items() if k in PORT_FIELDS}
        return replace(self, **changes)

    def url(self, channel: str, port: int | None = None) -> str:
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


def _field(d: dict[str, Any], name: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in d:
        if default is ...:
            raise ConfigError(f"connection file: required field {name!r} is missing")
        return default
    value = d[name]
    if not isinstance(value, types) or isinstance(value, bool):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise ConfigError(f"connection file: field {name!r} must be {want}, got {type(value).__name__}")
    return value


def parse_connection(d: Any, *, require_ports: bool = True) -> ConnectionInfo:
    """Validate a decoded connection file.

    ``require_ports=False`` allows absent ports (treated as 0), used for JEP 66
    registration files. Raises ConfigError naming the offending field.
    """
    if not isinstance(d, dict):
        raise ConfigError("connection file: top level must be a JSON object")
    ports: dict[str, int] = {}
    for name in PORT_FIELDS:
        value = _field(d, name, int, ... if require_ports else 0)
        if not 0 <= value <= 65535:
            raise ConfigError(f"connection file: field {name!r} must be in 0..65535, got {value}")
        ports[name] = value
    transport = _field(d, "transport", str, "tcp")
    if transport not in ("tcp", "ipc"):
        raise ConfigError(f"connection file: field 'transport' must be 'tcp' or 'ipc', got {transport!r}")
    ip = _field(d, "ip", str, "127.0.0.1") or "127.0.0.1"
    key = _field(d, "key", str)
    scheme = _field(d, "signature_scheme", str, "hmac-sha256")
    try:
        Signer(b"", scheme)
    except ConfigError as exc:
        raise ConfigError(f"connection file: field {exc}") from None
    curve_pub = d.get("curve_publickey")
    curve_sec = d.get("curve_secretkey")
    if (curve_pub is None) != (curve_sec is None):
        missing = "curve_secretkey" if curve_sec is None else "curve_publickey"
        raise ConfigError(f"connection file: field {missing!r} is missing (both curve keys are needed)")
    for name, value in (("curve_publickey", curve_pub), ("curve_secretkey", curve_sec)):
        if value is not None and (not isinstance(value, str) or len(value) != 40):
            raise ConfigError(f"connection file: field {name!r} must be a 40-character Z85 string")
    return ConnectionInfo(
        ip=ip,
        transport=transport,
        key=key.encode(),
        signature_scheme=scheme,
        kernel_name=_field(d, "kernel_name", str, ""),
        curve_publickey=curve_pub.encode() if curve_pub else None,
        curve_secretkey=curve_sec.encode() if curve_sec else None,
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


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename), mode 0600."""
    directory = os.path.dirname(os.path.abspath(path))
    import tempfile  # not on the start-up path unless ports are written back

    fd, tmp = tempfile.mkstemp(prefix=".trikernel-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Named bounds of memory and time (all configurable from the CLI).

    - ``iopub_capacity``: messages the IOPub queue holds before producers block.
    - ``iopub_send_timeout``: seconds a NODROP send may wait on a full
      subscriber before that one message is sent lossy (docs/design.md, "The IOPub path").
    - ``iopub_warn_after``: seconds of waiting before a (rate-limited) warning.
    - ``stream_batch_bytes``: largest coalesced ``stream`` message, in bytes.
    - ``handshake_timeout``: seconds to wait for the JEP 66 acknowledgement.
    - ``shutdown_grace``: seconds the kernel waits for user code at shutdown.
    - ``parent_poll_interval``: seconds between checks that the launcher lives.
    - ``capture_fds``: capture file descriptors 1 and 2 into the notebook.
    - ``max_frames``: int, frames; default 4096. Most frames one message may
      have (identities and buffers included); more is dropped unparsed.
    - ``max_json_bytes``: int, bytes; default 64 MiB. Largest header,
      parent_header, metadata or content frame; a bigger one is dropped unparsed.
    - ``max_json_depth``: int, levels; default 128. Deepest nesting of
      arrays/objects in a JSON frame; deeper is dropped unparsed.
    - ``max_topic_bytes``: int, bytes; default 1024. Longest IOPub
      subscription topic that gets an ``iopub_welcome``; a longer one is
      counted as bad input (clients subscribe to ``b""`` or a short prefix).
    - ``bad_input_log_interval``: float, seconds; default 10. After one bad
      message is logged, further ones are counted and summarised in one
      line per interval (docs/robustness.md).
    """

    iopub_capacity: int = 1000
    iopub_send_timeout: float = 5.0
    iopub_warn_after: float = 1.0
    stream_batch_bytes: int = 1 << 16
    handshake_timeout: float = 5.0
    shutdown_grace: float = 3.0
    parent_poll_interval: float = 1.0
    capture_fds: bool = True
    max_frames: int = DEFAULT_LIMITS.max_frames
    max_json_bytes: int = DEFAULT_LIMITS.max_json_bytes
    max_json_depth: int = DEFAULT_LIMITS.max_json_depth
    max_topic_bytes: int = 1024
    bad_input_log_interval: float = 10.0

    @property
    def wire_limits(self) -> WireLimits:
        """The bounds :func:`trikernel.wire.deserialize` applies to peers' messages."""
        return WireLimits(self.max_frames, self.max_json_bytes, self.max_json_depth)

    def __post_init__(self) -> None:
        if self.iopub_capacity < 1:
            raise ConfigError(f"--iopub-capacity must be >= 1, got {self.iopub_capacity}")
        for name in (
            "iopub_send_timeout",
            "iopub_warn_after",
            "handshake_timeout",
            "shutdown_grace",
            "bad_input_log_interval",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(self, name)}")
        if self.stream_batch_bytes < 1024:
            raise ConfigError(f"--stream-batch-bytes must be >= 1024, got {self.stream_batch_bytes}")
        # floors that leave room for every real client (docs/robustness.md)
        floors = (("max_frames", 16), ("max_json_bytes", 1 << 16), ("max_json_depth", 8), ("max_topic_bytes", 0))
        for name, least in floors:
            if getattr(self, name) < least:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(self, name)}")
