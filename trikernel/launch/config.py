"""The kernel's tunables: named bounds of memory and time, and its switches.

:class:`KernelConfig` declares each once (type, unit, default, help); the
command line (options.py) is derived from these declarations. The
connection file lives in ``trikernel.protocol.connection``.

Runs on: any thread (pure: no zmq, no trio).
"""

from __future__ import annotations

import math
from dataclasses import Field, dataclass, field, fields
from typing import Any

from trikernel.errors import ConfigError
from trikernel.protocol.wire import DEFAULT_LIMITS, WireLimits


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
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A KernelConfig field: its default, help text, unit and lower bound
    (``exclusive``: the value must be greater than ``minimum``), and an
    inclusive upper bound ``maximum`` where one is needed. ``flag``
    overrides the command-line flag derived from the field name; ``metavar``
    the name of its value in ``--help``; ``choices`` the values a string
    field may take."""
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
            "choices": choices,
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
    autoawait: str = knob(
        "asyncio",
        "what a cell's top-level await runs on at start (%autoawait switches it later): asyncio, a cell may "
        "await asyncio and trio alike on the kernel's asyncio loop; trio, pure trio (docs/trio.md)",
        choices=("asyncio", "trio"),
        metavar="{asyncio,trio}",
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
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise ConfigError(f"{flag_of(f)} must be one of {', '.join(choices)}, got {value!r}")
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
