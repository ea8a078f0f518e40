"""Pure configuration values: the connection file and kernel tunables.

Reads and validates connection files (jupyter_client docs/kernels.rst,
"Connection files"; CurveZMQ keys as provisioned by jupyter_client 8.10) and
holds the named bounds of time and memory the kernel uses. No zmq, no trio.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from .channels import CHANNELS, PORT_FIELDS
from .errors import ConfigError
from .wire import DEFAULT_LIMITS, Signer, WireLimits

__all__ = [
    "CHANNELS",
    "PORT_FIELDS",
    "ConnectionInfo",
    "KernelConfig",
    "Security",
    "check_port",
    "check_security",
    "parse_connection",
]


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


def knob(
    default: Any,
    help: str,
    *,
    unit: str = "",
    minimum: float | None = None,
    exclusive: bool = False,
    maximum: float | None = None,
    flag: str | None = None,
    metavar: str | None = None,
) -> Any:
    """A KernelConfig field: its default, help text, unit and lower bound
    (``exclusive``: the value must be greater than ``minimum``), and an
    inclusive upper bound ``maximum`` where one is needed. ``flag``
    overrides the command-line flag derived from the field name; ``metavar``
    the name of its value in ``--help``."""
    return field(
        default=default,
        metadata={
            "help": help,
            "unit": unit,
            "minimum": minimum,
            "exclusive": exclusive,
            "maximum": maximum,
            "flag": flag,
            "metavar": metavar,
        },
    )


def flag_of(f: Field[Any]) -> str:
    """The command-line flag of a KernelConfig field: ``iopub_capacity`` → ``--iopub-capacity``;
    a boolean that defaults to True is switched off with its ``flag``."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Named bounds of memory and time, and the kernel's switches.

    Each field is declared once, here, with its type, unit, default and
    help; the command line (cli.py) is derived from these declarations.
    Raises ConfigError naming the flag for a value out of range.
    """

    iopub_capacity: int = knob(1000, "IOPub queue size before producers block", unit="messages", minimum=1)
    iopub_send_timeout: float = knob(
        5.0, "time a full subscriber is waited for before it loses a message", unit="s", minimum=0, exclusive=True
    )
    iopub_warn_after: float = knob(
        1.0, "waiting time on a full subscriber before a warning is logged", unit="s", minimum=0, exclusive=True
    )
    iopub_hold_bytes: int = knob(
        8 << 20,
        "IOPub messages held while no one has subscribed yet or no connection is left, sent to the next "
        "subscriber after its welcome; past it the oldest are dropped (0: none held)",
        unit="bytes",
        minimum=0,
    )
    stream_batch_chars: int = knob(1 << 16, "largest coalesced stream message", unit="characters", minimum=1024)
    handshake_timeout: float = knob(
        5.0, "time to wait for the JEP 66 acknowledgement", unit="s", minimum=0, exclusive=True
    )
    shutdown_grace: float = knob(3.0, "time user code gets to stop at shutdown", unit="s", minimum=0, exclusive=True)
    parent_poll_interval: float = knob(
        1.0,
        "time between checks that the launching process (JPY_PARENT_PID) lives",
        unit="s",
        minimum=0,
        exclusive=True,
    )
    max_frames: int = knob(
        DEFAULT_LIMITS.max_frames,
        "most frames in one incoming message (identities and buffers included); more is dropped unparsed",
        unit="frames",
        minimum=16,
    )
    max_json_bytes: int = knob(
        DEFAULT_LIMITS.max_json_bytes,
        "largest incoming header, parent_header, metadata or content frame; bigger is dropped unparsed",
        unit="bytes",
        minimum=1 << 16,
    )
    max_json_depth: int = knob(
        DEFAULT_LIMITS.max_json_depth,
        "deepest nesting of arrays/objects in an incoming JSON frame; deeper is dropped unparsed",
        unit="levels",
        minimum=8,
        # orjson's encoder limit: everything accepted can be encoded again (docs/robustness.md)
        maximum=254,
    )
    max_topic_bytes: int = knob(
        1024, "longest IOPub subscription topic that gets an iopub_welcome", unit="bytes", minimum=0
    )
    bad_input_log_interval: float = knob(
        10.0,
        "after one bad message is logged, further ones are counted and summarised once per interval",
        unit="s",
        minimum=0,
        exclusive=True,
    )
    switch_interval: float = knob(
        0.001,
        "Python's thread switch interval (sys.setswitchinterval): how long a busy cell keeps the GIL "
        "before the io thread gets it; Python's default is 0.005",
        unit="s",
        minimum=0,
        exclusive=True,
    )
    control_switch_interval: float = knob(
        0.0002,
        "the switch interval while a control request (kernel_info, interrupt, the debugger's) is received "
        "and answered, so a cell that holds the GIL delays it less; the same as switch_interval turns this off",
        unit="s",
        minimum=0,
        exclusive=True,
    )
    capture_fds: bool = knob(
        True,
        "leave file descriptors 1 and 2 alone: output of subprocesses and C code then goes to the kernel's "
        "terminal instead of the notebook",
        flag="--no-capture-fd",
    )
    fd_backlog_bytes: int = knob(
        64 << 20,
        "fd 1 (and fd 2) output held for the notebook; more is dropped, counted and shown",
        unit="bytes",
        minimum=1 << 16,
    )
    strict: bool = knob(
        False,
        "validate every incoming message against the messaging spec; a violation is answered with a "
        "ProtocolError naming the field and the spec section, and not run (needs trikernel[conformance]; "
        "docs/conformance.md)",
    )
    message_log: str = knob(
        "", "append one JSON line per message in and out to this file (docs/conformance.md)", metavar="FILE"
    )
    message_log_content: int = knob(
        4096,
        "content of a logged message kept in its line; longer content is cut (its size is always logged)",
        unit="bytes",
        minimum=0,
    )
    message_log_queue: int = knob(
        10000,
        "message-log lines waiting for the writer thread; past it lines are dropped and counted",
        unit="lines",
        minimum=1,
    )

    @property
    def wire_limits(self) -> WireLimits:
        """The bounds :func:`trikernel.wire.deserialize` applies to peers' messages."""
        return WireLimits(self.max_frames, self.max_json_bytes, self.max_json_depth)

    def __post_init__(self) -> None:
        for f in fields(self):
            low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
            value = getattr(self, f.name)
            if (low is None and high is None) or isinstance(value, bool):
                continue
            if isinstance(value, float) and math.isnan(value):
                # nan compares false with everything: a nan timeout would never expire
                raise ConfigError(f"{flag_of(f)} must be a number, got nan")
            unit = f" {f.metadata['unit']}" if f.metadata["unit"] else ""
            if low is not None and (value <= low if f.metadata["exclusive"] else value < low):
                op = ">" if f.metadata["exclusive"] else ">="
                raise ConfigError(f"{flag_of(f)} must be {op} {low:g}{unit}, got {value}")
            if high is not None and value > high:
                raise ConfigError(f"{flag_of(f)} must be <= {high:g}{unit}, got {value}")
