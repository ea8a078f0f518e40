"""ZeroMQ socket options: catalogue, parsing, precedence, validation, apply.

One job: turn the socket options an operator gives (command line,
environment variable, TOML config file) plus trikernel's defaults into one
validated, per-channel set of effective options, and set that set on a
fresh socket *before* it is bound.

Why before bind: libzmq copies a socket's options into the listener at
``bind()``; a connection accepted later gets the options the socket had
then. An HWM changed after bind never reaches a subscriber that connects
later (libzmq zmq_setsockopt(3) does not say so; pyzmq's ``Socket.set_hwm``
warns about it). :func:`apply_options` therefore refuses a socket that is
already bound or connected.

Channels and their socket types: ``shell``, ``control``, ``stdin`` and
``hb`` are ``ZMQ_ROUTER`` (``hb`` is echoed in C by ``zmq.proxy``), ``iopub``
is ``ZMQ_XPUB``; ``*`` means all five.

Precedence (documented in docs/socket-options.md):

1. source first: ``--socket-option`` (CLI) > ``TRIKERNEL_SOCKET_OPTIONS``
   (environment) > config file ``[socket_options]`` > built-in defaults;
2. within one source, a channel-specific entry beats a ``*`` entry for the
   same option, whatever their order;
3. within one source and the same specificity, the last entry wins.

So ``--socket-option *.LINGER=0`` beats ``TRIKERNEL_SOCKET_OPTIONS=shell.LINGER=5``
(the CLI is the stronger source), and ``*.LINGER=0 shell.LINGER=5`` in one
source gives shell 5 and every other channel 0.

Validation is complete before anything is applied: :func:`resolve` checks
every entry of every source and raises :class:`~trikernel.errors.ConfigError`
(one line naming the option, the channel and what is allowed) at the first
bad one, so a kernel never starts with a partial set.

Option names and value semantics: libzmq's zmq_setsockopt(3) (4.3), looked
up through pyzmq's :class:`zmq.SocketOption`.

Not thread-safe to apply to one socket from two threads (no ZeroMQ socket is);
:class:`SocketOptions` itself is immutable and may be shared freely.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import zmq

from .channels import CHANNELS
from .errors import ConfigError
from .sockets import SOCKET_TYPES

__all__ = [
    "ALL_CHANNELS",
    "CATALOGUE",
    "CHANNELS",
    "CHANNEL_SOCKET_TYPES",
    "CONFIG_TABLE",
    "DEFAULTS",
    "ENV_VAR",
    "OptionSpec",
    "OptionValue",
    "SocketOptions",
    "add_arguments",
    "apply_options",
    "format_spec",
    "parse_spec",
    "read_back",
    "resolve",
]

log = logging.getLogger("trikernel.sockopts")

#: An effective option value: ``int`` for integer/boolean options, ``bytes``
#: for string options (what ``zmq.Socket.setsockopt`` takes).
OptionValue = int | bytes

#: The channel wildcard: the option is set on all five channels.
ALL_CHANNELS = "*"
#: Socket type of each channel (zmq socket-type constants; channels.py).
CHANNEL_SOCKET_TYPES: Mapping[str, int] = SOCKET_TYPES
#: Environment variable holding specs separated by whitespace or ``;``.
ENV_VAR = "TRIKERNEL_SOCKET_OPTIONS"
#: Name of the TOML table read from the ``--config`` file.
CONFIG_TABLE = "socket_options"

_ROUTER = frozenset({zmq.ROUTER})
_XPUB = frozenset({zmq.XPUB})
_BOTH = frozenset({zmq.ROUTER, zmq.XPUB})
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_ROUTER_CHANNELS = tuple(c for c in CHANNELS if CHANNEL_SOCKET_TYPES[c] == zmq.ROUTER)
_SOCKET_TYPE_NAMES: Mapping[int, str] = {zmq.ROUTER: "ROUTER", zmq.XPUB: "XPUB"}


@dataclass(frozen=True)
class OptionSpec:
    """One supported libzmq socket option and the values trikernel accepts.

    ``kind``: ``"int"`` (decimal integer), ``"bool"`` (0/1, also
    true/false), ``"bytes"`` (UTF-8 text, set as bytes).
    ``minimum``/``maximum``: inclusive bounds for ints (for bytes: length in
    bytes). ``choices``: if set, the only accepted values. ``step``: the
    value must be a multiple of it (libzmq would round otherwise).
    ``socket_types``: zmq socket types it applies to. ``readable``: libzmq
    supports getsockopt for it (ROUTER_HANDOVER, XPUB_NODROP and
    XPUB_VERBOSE are write-only). ``allowed``: the human text used in error
    messages and docs. ``unit`` and ``doc``: for docs/socket-options.md.
    """

    name: str
    kind: Literal["int", "bool", "bytes"]
    socket_types: frozenset[int]
    allowed: str
    unit: str
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[int, ...] | None = None
    step: int = 1
    readable: bool = True

    def applies_to(self, channel: str) -> bool:
        """True if the option applies to ``channel`` (``*``: to all five)."""
        if channel == ALL_CHANNELS:
            return all(CHANNEL_SOCKET_TYPES[c] in self.socket_types for c in CHANNELS)
        return CHANNEL_SOCKET_TYPES[channel] in self.socket_types

    def channels(self) -> tuple[str, ...]:
        """The channels this option applies to, in :data:`CHANNELS` order."""
        return tuple(c for c in CHANNELS if CHANNEL_SOCKET_TYPES[c] in self.socket_types)


def _int(
    name: str,
    allowed: str,
    unit: str,
    doc: str,
    *,
    minimum: int,
    maximum: int = _INT32_MAX,
    step: int = 1,
    socket_types: frozenset[int] = _BOTH,
) -> OptionSpec:
    return OptionSpec(name, "int", socket_types, allowed, unit, doc, minimum=minimum, maximum=maximum, step=step)


def _bool(
    name: str,
    doc: str,
    *,
    socket_types: frozenset[int] = _BOTH,
    readable: bool = True,
    choices: tuple[int, ...] = (0, 1),
    allowed: str = "0 or 1",
) -> OptionSpec:
    return OptionSpec(name, "bool", socket_types, allowed, "boolean", doc, choices=choices, readable=readable)


#: Every option trikernel accepts, by libzmq name (without ``ZMQ_``). This is
#: the allow-list; everything else is rejected with a reason (see
#: ``_REJECTED``). Ranges follow zmq_setsockopt(3); where libzmq accepts a
#: value that only fails later (at bind/accept) or is silently rounded,
#: trikernel is stricter and says so in ``allowed``.
CATALOGUE: Mapping[str, OptionSpec] = {
    s.name: s
    for s in (
        _int(
            "SNDHWM",
            "an integer >= 0 (messages; 0 = no limit)",
            "messages",
            "High-water mark for outbound messages queued per peer. At the mark a "
            "ROUTER drops, an XPUB drops (XPUB_NODROP=0) or refuses with EAGAIN "
            "(XPUB_NODROP=1). 0 means no limit (unbounded memory; discouraged).",
            minimum=0,
        ),
        _int(
            "RCVHWM",
            "an integer >= 0 (messages; 0 = no limit)",
            "messages",
            "High-water mark for inbound messages queued per peer before the kernel "
            "reads them. 0 means no limit (unbounded memory; discouraged).",
            minimum=0,
        ),
        _int(
            "LINGER",
            "an integer >= -1 (milliseconds; -1 = wait forever, 0 = discard)",
            "ms",
            "How long unsent messages are kept after close. -1 can hang shutdown forever when a peer stopped reading.",
            minimum=-1,
        ),
        _int(
            "SNDTIMEO",
            "an integer >= -1 (milliseconds; -1 = block forever)",
            "ms",
            "Timeout of a blocking send. trikernel's own sends are non-blocking, so "
            "this only affects blocking calls; the IOPub stall timeout is a kernel "
            "setting, not this option.",
            minimum=-1,
        ),
        _int(
            "RCVTIMEO",
            "an integer >= -1 (milliseconds; -1 = block forever)",
            "ms",
            "Timeout of a blocking receive. trikernel's receives wait in trio (or in "
            "zmq_proxy for hb), so this only affects blocking calls.",
            minimum=-1,
        ),
        _int(
            "MAXMSGSIZE",
            "an integer >= -1 (bytes; -1 = no limit)",
            "bytes",
            "Largest inbound message accepted; a peer sending a bigger one is "
            "disconnected. Applies to each message part's total.",
            minimum=-1,
            maximum=_INT64_MAX,
        ),
        _int(
            "SNDBUF",
            "an integer >= -1 (bytes; -1 or 0 = OS default)",
            "bytes",
            "Kernel (OS) TCP send buffer size (SO_SNDBUF).",
            minimum=-1,
        ),
        _int(
            "RCVBUF",
            "an integer >= -1 (bytes; -1 or 0 = OS default)",
            "bytes",
            "Kernel (OS) TCP receive buffer size (SO_RCVBUF).",
            minimum=-1,
        ),
        OptionSpec(
            "TCP_KEEPALIVE",
            "int",
            _BOTH,
            "-1, 0 or 1 (-1 = OS default)",
            "tri-state",
            "SO_KEEPALIVE on accepted TCP connections; keeps idle connections "
            "alive through firewalls/NAT that cut them.",
            choices=(-1, 0, 1),
        ),
        _int(
            "TCP_KEEPALIVE_IDLE",
            "-1 (OS default) or an integer >= 1 (seconds)",
            "s",
            "TCP_KEEPIDLE: idle time before the first keepalive probe.",
            minimum=-1,
        ),
        _int(
            "TCP_KEEPALIVE_INTVL",
            "-1 (OS default) or an integer >= 1 (seconds)",
            "s",
            "TCP_KEEPINTVL: time between keepalive probes.",
            minimum=-1,
        ),
        _int(
            "TCP_KEEPALIVE_CNT",
            "-1 (OS default) or an integer >= 1 (probes)",
            "probes",
            "TCP_KEEPCNT: unanswered probes before the connection is dropped.",
            minimum=-1,
        ),
        _int(
            "TCP_MAXRT",
            "an integer >= 0 (milliseconds; 0 = OS default)",
            "ms",
            "TCP_USER_TIMEOUT: how long sent data may stay unacknowledged before the connection is dropped.",
            minimum=0,
        ),
        _int(
            "BACKLOG",
            "an integer >= 0 (connections)",
            "connections",
            "listen() backlog of pending connections; takes effect at bind.",
            minimum=0,
        ),
        _int(
            "HANDSHAKE_IVL",
            "an integer >= 0 (milliseconds; 0 = no limit)",
            "ms",
            "Maximum time for the ZMTP (and CurveZMQ) handshake of a new connection.",
            minimum=0,
        ),
        _int(
            "HEARTBEAT_IVL",
            "an integer >= 0 (milliseconds; 0 = off)",
            "ms",
            "Interval of ZMTP PING heartbeats on each connection (protocol level; not the Jupyter hb channel).",
            minimum=0,
        ),
        _int(
            "HEARTBEAT_TTL",
            "a multiple of 100 from 0 to 6553500 (milliseconds)",
            "ms",
            "TTL the kernel asks peers to apply to its ZMTP heartbeats; libzmq "
            "keeps deciseconds, so trikernel accepts multiples of 100 only.",
            minimum=0,
            maximum=6553500,
            step=100,
        ),
        _int(
            "HEARTBEAT_TIMEOUT",
            "an integer >= 0 (milliseconds)",
            "ms",
            "How long to wait for a PONG before closing the connection (libzmq default: HEARTBEAT_IVL).",
            minimum=0,
        ),
        _int(
            "TOS",
            "an integer from 0 to 255",
            "IP TOS byte",
            "IP type-of-service / DSCP byte of outgoing packets.",
            minimum=0,
            maximum=255,
        ),
        _bool(
            "IMMEDIATE",
            "Queue only on completed connections. Matters to connecting sockets; "
            "trikernel binds every channel, so it has no visible effect there. "
            "Accepted for completeness.",
        ),
        _bool(
            "IPV6",
            "Allow IPv6 on the socket; needed when the connection file's ip is an IPv6 address (e.g. '::').",
        ),
        OptionSpec(
            "BINDTODEVICE",
            "bytes",
            _BOTH,
            "a network interface name of 1 to 15 characters",
            "interface name",
            "SO_BINDTODEVICE: accept connections only through this interface (Linux; needs CAP_NET_RAW).",
            minimum=1,
            maximum=15,
        ),
        _bool(
            "ROUTER_HANDOVER",
            "A client reconnecting with the routing id of a live connection takes "
            "it over instead of being refused. Write-only in libzmq.",
            socket_types=_ROUTER,
            readable=False,
        ),
        _bool(
            "XPUB_NODROP",
            "At SNDHWM, refuse the send (EAGAIN) instead of dropping silently; the "
            "iopub task then waits, and falls back to dropping for one message "
            "after its stall timeout. Write-only in libzmq.",
            socket_types=_XPUB,
            readable=False,
        ),
        _bool(
            "XPUB_VERBOSE",
            "Pass every subscription (not only the first per topic) to the kernel, "
            "so each new subscriber gets iopub_welcome (JEP 65). Fixed to 1: the "
            "kernel relies on it. Write-only in libzmq.",
            socket_types=_XPUB,
            readable=False,
            choices=(1,),
            allowed="1 (the kernel needs every subscription to send iopub_welcome)",
        ),
    )
}


#: Defaults per channel, with the reason for each (see docs/socket-options.md).
#: - LINGER=1000 everywhere: shutdown flushes pending replies/outputs for up
#:   to 1 s but never hangs on a peer that stopped reading (libzmq: -1).
#: - ROUTER_HANDOVER=0 on ROUTER channels (libzmq's default, stated): every
#:   client a jupyter_client KernelManager makes shares one session and so
#:   one DEALER identity; with handover on, a second client's connection
#:   takes over the first one's route and the first one's requests and
#:   replies are lost (seen in tests/test_kernel.py). Operators whose
#:   clients use unique identities may turn it on.
#: - iopub SNDHWM=10000: finite, so a stalled subscriber costs bounded memory;
#:   10x libzmq's 1000 so ordinary output bursts fit without stalling.
#: - iopub XPUB_NODROP=1: a full subscriber makes the send wait (the iopub
#:   task's timeout fallback then drops for that one message) instead of
#:   silent loss.
#: - iopub XPUB_VERBOSE=1: every subscriber gets iopub_welcome (JEP 65).
DEFAULTS: Mapping[str, Mapping[str, OptionValue]] = {
    **{c: {"LINGER": 1000, "ROUTER_HANDOVER": 0} for c in _ROUTER_CHANNELS},
    "iopub": {"LINGER": 1000, "SNDHWM": 10000, "XPUB_NODROP": 1, "XPUB_VERBOSE": 1},
}


_SECURITY = "is reserved: the kernel sets security options itself (CurveZMQ keys from the connection file)"
_CONNECT_ONLY = "applies only to connecting sockets; trikernel binds every channel"
_READ_ONLY = "is read-only"
_SEMANTICS = "would change message semantics the kernel relies on"
_NOT_USED = "concerns a transport, socket type or feature trikernel does not use"

#: Reasons for options pyzmq knows but trikernel refuses. Any other known
#: option not in CATALOGUE gets "not supported by trikernel".
_REJECTED: Mapping[str, str] = {
    "SUBSCRIBE": "is never allowed: subscriptions belong to the clients, not to the kernel",
    "UNSUBSCRIBE": "is never allowed: subscriptions belong to the clients, not to the kernel",
    "ROUTING_ID": "is not configurable: the kernel's own routing id plays no role for its clients",
    "CONNECT_ROUTING_ID": _CONNECT_ONLY,
    "AFFINITY": "is not configurable: I/O-thread affinity is a context setting of the kernel",
    "HWM": "is a deprecated alias; give SNDHWM and RCVHWM",
    "MECHANISM": _READ_ONLY,
    **{n: _READ_ONLY for n in ("RCVMORE", "FD", "EVENTS", "TYPE", "LAST_ENDPOINT", "THREAD_SAFE")},
    "TOPICS_COUNT": _READ_ONLY,
    **{
        n: _CONNECT_ONLY
        for n in (
            "RECONNECT_IVL",
            "RECONNECT_IVL_MAX",
            "RECONNECT_STOP",
            "CONNECT_TIMEOUT",
            "SOCKS_PROXY",
            "SOCKS_USERNAME",
            "SOCKS_PASSWORD",
            "PROBE_ROUTER",
        )
    },
    **{
        n: _SEMANTICS
        for n in (
            "ROUTER_MANDATORY",
            "ROUTER_RAW",
            "ROUTER_NOTIFY",
            "CONFLATE",
            "XPUB_MANUAL",
            "XPUB_MANUAL_LAST_VALUE",
            "XPUB_WELCOME_MSG",
            "XPUB_VERBOSER",
            "ONLY_FIRST_SUBSCRIBE",
            "HELLO_MSG",
            "DISCONNECT_MSG",
            "HICCUP_MSG",
            "METADATA",
            "USE_FD",
        )
    },
}


def _rejection_reason(name: str) -> str:
    if name in _REJECTED:
        return _REJECTED[name]
    if name.startswith(("CURVE_", "PLAIN_", "ZAP_", "GSSAPI_")):
        return _SECURITY
    if name.startswith(("MULTICAST_", "VMCI_", "NORM_", "WSS_", "IPC_FILTER_", "REQ_", "STREAM_", "XSUB_")) or name in (
        "RATE",
        "RECOVERY_IVL",
        "TCP_ACCEPT_FILTER",
        "IPV4ONLY",
        "INVERT_MATCHING",
    ):
        return _NOT_USED
    return "is not supported by trikernel"


def _supported_on(channel: str) -> str:
    names = sorted(n for n, s in CATALOGUE.items() if s.applies_to(channel))
    return ", ".join(names)


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class _Entry:
    """One validated option setting from one source."""

    rank: int  # 0 defaults, 1 config file, 2 environment, 3 CLI
    channel: str  # a channel name or "*"
    name: str
    value: OptionValue
    source: str  # human label for logs/errors


_RANK_DEFAULT, _RANK_FILE, _RANK_ENV, _RANK_CLI = 0, 1, 2, 3
_SPEC_RE = re.compile(r"^\s*(?P<channel>[^.=\s]+)\.(?P<name>[^=\s]+)\s*=(?P<value>.*)$")


def _fail(channel: str, name: str, raw: object, source: str, problem: str) -> ConfigError:
    shown = f"{channel}.{name}" + ("" if raw is None else f"={raw}")
    return ConfigError(f"socket option {shown} ({source}): {problem}")


def _lookup(channel: str, raw_name: str, raw_value: object, source: str) -> tuple[str, OptionSpec]:
    """Return (channel, spec) for a raw channel and option name, or raise."""
    chan = channel.strip().lower()
    if chan != ALL_CHANNELS and chan not in CHANNEL_SOCKET_TYPES:
        raise _fail(
            channel,
            raw_name,
            raw_value,
            source,
            f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)} or * (all five)",
        )
    name = raw_name.strip().upper()
    name = name.removeprefix("ZMQ_")
    members = zmq.SocketOption.__members__
    if name not in members:
        import difflib  # only on the error path

        close = difflib.get_close_matches(name, list(CATALOGUE), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise _fail(
            chan,
            name,
            raw_value,
            source,
            f"unknown ZeroMQ socket option {name}{hint}; supported on {chan}: {_supported_on(chan)}",
        )
    canonical = str(members[name].name)  # resolves aliases such as IDENTITY -> ROUTING_ID
    spec = CATALOGUE.get(canonical)
    if spec is None:
        alias = f" ({canonical})" if canonical != name else ""
        raise _fail(
            chan,
            name,
            raw_value,
            source,
            f"{name}{alias} {_rejection_reason(canonical)}; supported on {chan}: {_supported_on(chan)}",
        )
    if not spec.applies_to(chan):
        where = " and ".join(
            f"{_SOCKET_TYPE_NAMES[t]} channels ({', '.join(c for c in CHANNELS if CHANNEL_SOCKET_TYPES[c] == t)})"
            for t in sorted(spec.socket_types)
        )
        if chan == ALL_CHANNELS:
            problem = (
                f"{spec.name} applies only to {where}, not to all five channels (*); "
                f"give it per channel, e.g. {spec.channels()[0]}.{spec.name}=..."
            )
        else:
            kind = _SOCKET_TYPE_NAMES[CHANNEL_SOCKET_TYPES[chan]]
            problem = f"{spec.name} applies only to {where}, not to {chan} (a {kind} socket)"
        raise _fail(chan, name, raw_value, source, problem)
    return chan, spec


_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def _convert(spec: OptionSpec, raw: object) -> OptionValue | None:
    """Convert a raw CLI/env string or TOML value; None if the type is wrong."""
    if spec.kind == "bytes":
        if isinstance(raw, str):
            return raw.strip().encode("utf-8")
        return None
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return int(raw)
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str):
            word = raw.strip().lower()
            if word in _TRUE:
                return 1
            if word in _FALSE:
                return 0
            try:
                return int(word, 10)
            except ValueError:
                return None
        return None
    if isinstance(raw, bool):  # TOML true/false for an integer option
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip(), 10)
        except ValueError:
            return None
    return None


def _check_value(spec: OptionSpec, value: OptionValue) -> bool:
    if isinstance(value, bytes):
        if spec.minimum is not None and len(value) < spec.minimum:
            return False
        if spec.maximum is not None and len(value) > spec.maximum:
            return False
        return not any(ch in value for ch in b" \t\r\n\0/")
    if spec.choices is not None:
        return value in spec.choices
    if spec.minimum is not None and value < spec.minimum:
        return False
    if spec.maximum is not None and value > spec.maximum:
        return False
    if spec.name.startswith("TCP_KEEPALIVE_") and value == 0:
        return False  # libzmq accepts 0 but the OS then refuses it at accept time
    return value % spec.step == 0


def _entry(rank: int, channel: str, raw_name: str, raw_value: object, source: str) -> _Entry:
    chan, spec = _lookup(channel, raw_name, raw_value, source)
    value = _convert(spec, raw_value)
    if value is None or not _check_value(spec, value):
        raise _fail(
            chan,
            spec.name,
            raw_value,
            source,
            f"bad value {raw_value!r}; {spec.name} takes {spec.allowed}",
        )
    return _Entry(rank, chan, spec.name, value, source)


def parse_spec(spec: str, *, source: str = "--socket-option") -> tuple[str, str, OptionValue]:
    """Parse and validate one ``CHANNEL.NAME=VALUE`` spec.

    Returns ``(channel, NAME, value)`` with the channel lower-case (or ``*``),
    the canonical upper-case libzmq name and an ``int`` or ``bytes`` value.
    Raises :class:`ConfigError` (one line naming option, channel, ``source``
    and what is allowed) for bad syntax, an unknown channel or option, an
    option that does not apply to the channel, or a bad value.
    """
    match = _SPEC_RE.match(spec)
    if match is None:
        raise ConfigError(
            f"bad socket option {spec!r} ({source}): expected CHANNEL.NAME=VALUE, "
            f"e.g. iopub.SNDHWM=10000; channels: {', '.join(CHANNELS)} or *"
        )
    e = _entry(_RANK_CLI, match["channel"], match["name"], match["value"], source)
    return e.channel, e.name, e.value


def format_spec(channel: str, name: str, value: OptionValue) -> str:
    """Inverse of :func:`parse_spec`: ``"iopub.SNDHWM=10000"``."""
    text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return f"{channel}.{name}={text}"


def _from_specs(specs: Iterable[str], rank: int, source: str) -> list[_Entry]:
    out = []
    for spec in specs:
        chan, name, value = parse_spec(spec, source=source)
        out.append(_Entry(rank, chan, name, value, source))
    return out


def _from_env(environ: Mapping[str, str]) -> list[_Entry]:
    text = environ.get(ENV_VAR, "")
    specs = [s for s in re.split(r"[\s;]+", text) if s]
    return _from_specs(specs, _RANK_ENV, ENV_VAR)


def _from_config(path: str) -> list[_Entry]:
    import tomllib  # only when a config file is given

    label = f"config file {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{label}: not found (given with --config)") from None
    except OSError as e:
        raise ConfigError(f"{label}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{label}: invalid TOML: {e}") from None
    table = data.get(CONFIG_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(
            f'{label}: [{CONFIG_TABLE}] must be a table of "CHANNEL.NAME" = value, got {type(table).__name__}'
        )
    source = f"{label} [{CONFIG_TABLE}]"
    out: list[_Entry] = []
    for key, value in table.items():
        if isinstance(value, dict):
            # [socket_options.iopub] SNDHWM = 1  or  iopub.SNDHWM = 1 (dotted key)
            for name, inner in value.items():
                if isinstance(inner, dict):
                    raise _fail(key, name, None, source, 'nested too deep; use "CHANNEL.NAME" = value')
                out.append(_entry(_RANK_FILE, key, name, inner, source))
            continue
        if "." not in key:
            raise ConfigError(
                f'{source}: bad key {key!r}; expected "CHANNEL.NAME" = value, e.g. "iopub.SNDHWM" = 10000'
            )
        channel, name = key.split(".", 1)
        out.append(_entry(_RANK_FILE, channel, name, value, source))
    return out


# --------------------------------------------------------------------------- result


Pairs = tuple[tuple[str, OptionValue], ...]


@dataclass(frozen=True)
class SocketOptions:
    """The effective, validated socket options of all five channels.

    ``effective``: ``((channel, ((NAME, value), ...)), ...)`` in
    :data:`CHANNELS` order, names sorted alphabetically. ``sources``: the
    same shape with the label of the source that set each value
    (``"default"``, ``"--socket-option"``, ``TRIKERNEL_SOCKET_OPTIONS`` or
    ``"config file PATH [socket_options]"``). Build with :func:`resolve`.
    """

    effective: tuple[tuple[str, Pairs], ...]
    sources: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    def for_channel(self, channel: str) -> Pairs:
        """Effective ``(NAME, value)`` pairs of ``channel``, sorted by name.

        Raises ``KeyError`` for a name that is not one of :data:`CHANNELS`.
        """
        for chan, pairs in self.effective:
            if chan == channel:
                return pairs
        raise KeyError(channel)

    def source_of(self, channel: str, name: str) -> str:
        """Label of the source that set ``name`` on ``channel``; KeyError if unset."""
        for chan, pairs in self.sources:
            if chan == channel:
                return dict(pairs)[name]
        raise KeyError(channel)

    def describe(self, channel: str) -> str:
        """The debug line: ``"effective socket options for iopub: LINGER=1000 ..."``."""
        items = " ".join(format_spec(channel, n, v).split(".", 1)[1] for n, v in self.for_channel(channel))
        return f"effective socket options for {channel}: {items}"

    def non_default(self) -> list[tuple[str, str, OptionValue]]:
        """``(channel, NAME, value)`` for every value that differs from :data:`DEFAULTS`."""
        out = []
        for chan, pairs in self.effective:
            for name, value in pairs:
                if DEFAULTS[chan].get(name) != value:
                    out.append((chan, name, value))
        return out

    def as_argv(self) -> list[str]:
        """``["--socket-option", SPEC, ...]`` reproducing every non-default value.

        Meant for baking into a kernelspec's argv at install time: it holds
        the result of all sources (CLI, environment, config file), so the
        installed kernel needs neither the variable nor the file. A value
        equal on all five channels (and allowed on all) is written once as
        ``*.NAME=VALUE``. Round trip: ``resolve(specs_of(as_argv()), {}, None)``
        equals ``self`` in ``effective``. Order: wildcard specs first, then by
        channel (CHANNELS order) and name.
        """
        nd = self.non_default()
        by_name: dict[str, dict[str, OptionValue]] = {}
        for chan, name, value in nd:
            by_name.setdefault(name, {})[chan] = value
        argv: list[str] = []
        wild: set[str] = set()
        for name in sorted(by_name):
            vals = by_name[name]
            if set(vals) == set(CHANNELS) and len(set(vals.values())) == 1:
                wild.add(name)
                argv += ["--socket-option", format_spec(ALL_CHANNELS, name, vals["shell"])]
        for chan, name, value in nd:
            if name not in wild:
                argv += ["--socket-option", format_spec(chan, name, value)]
        return argv


def _merge(entries: Sequence[_Entry]) -> SocketOptions:
    # Sort: source rank, then "*" before a specific channel; Python's sort is
    # stable so the given order decides among equals (last wins).
    ordered = sorted(entries, key=lambda e: (e.rank, e.channel != ALL_CHANNELS))
    eff: dict[str, dict[str, OptionValue]] = {c: {} for c in CHANNELS}
    src: dict[str, dict[str, str]] = {c: {} for c in CHANNELS}
    for e in ordered:
        targets = CHANNELS if e.channel == ALL_CHANNELS else (e.channel,)
        for chan in targets:
            eff[chan][e.name] = e.value
            src[chan][e.name] = e.source
    return SocketOptions(
        effective=tuple((c, tuple(sorted(eff[c].items()))) for c in CHANNELS),
        sources=tuple((c, tuple(sorted(src[c].items()))) for c in CHANNELS),
    )


def _defaults() -> list[_Entry]:
    return [
        _Entry(_RANK_DEFAULT, chan, name, value, "default")
        for chan in CHANNELS
        for name, value in DEFAULTS[chan].items()
    ]


def resolve(
    cli_specs: Sequence[str] | None,
    environ: Mapping[str, str],
    config_path: str | None,
) -> SocketOptions:
    """Validate every source and merge them into the effective options.

    ``cli_specs``: the ``--socket-option`` values, e.g. ``["iopub.SNDHWM=20000"]``
    (None is taken as empty). ``environ``: usually ``os.environ``; only
    :data:`ENV_VAR` is read (specs separated by whitespace or ``;``).
    ``config_path``: a TOML file whose ``[socket_options]`` table maps
    ``"CHANNEL.NAME"`` to a value (or ``[socket_options.CHANNEL]`` tables);
    other tables in the file are ignored here.

    Precedence: CLI > environment > config file > :data:`DEFAULTS`; within one
    source a channel entry beats ``*``; then the last entry wins.

    Raises :class:`ConfigError` (one line) for a missing/unreadable/invalid
    file or any bad entry; nothing is applied anywhere by this function.
    """
    entries = _defaults()
    if config_path is not None:
        entries += _from_config(config_path)
    entries += _from_env(environ)
    entries += _from_specs(cli_specs or (), _RANK_CLI, "--socket-option")
    options = _merge(entries)
    for chan in CHANNELS:
        for name, value in options.for_channel(chan):
            if name in ("SNDHWM", "RCVHWM") and value == 0:
                log.warning(
                    "socket option %s.%s=0 (%s) removes the high-water mark: memory is unbounded",
                    chan,
                    name,
                    options.source_of(chan, name),
                )
    return options


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--socket-option SPEC`` (repeatable) and ``--config PATH`` to ``parser``.

    Results land in ``args.socket_options`` (list of str, default empty) and
    ``args.config`` (str or None); pass them to :func:`resolve`.
    """
    parser.add_argument(
        "--socket-option",
        dest="socket_options",
        action="append",
        default=[],
        metavar="CHANNEL.NAME=VALUE",
        help=(
            "set a ZeroMQ socket option before bind, e.g. iopub.SNDHWM=10000 or "
            f"*.TCP_KEEPALIVE=1; CHANNEL is {', '.join(CHANNELS)} or *; "
            f"repeatable; beats ${ENV_VAR} and --config (see docs/socket-options.md)"
        ),
    )
    parser.add_argument(
        "--config",
        dest="config",
        default=None,
        metavar="PATH",
        help=f'TOML config file; its [{CONFIG_TABLE}] table maps "CHANNEL.NAME" to a value',
    )


# --------------------------------------------------------------------------- sockets


def _check_socket(sock: zmq.Socket[Any], channel: str) -> None:
    if channel not in CHANNEL_SOCKET_TYPES:
        raise ValueError(f"unknown channel {channel!r}; expected one of {CHANNELS}")
    expected = CHANNEL_SOCKET_TYPES[channel]
    actual = int(sock.getsockopt(zmq.TYPE))
    if actual != expected:
        raise ValueError(f"{channel} needs a {_SOCKET_TYPE_NAMES[expected]} socket, got socket type {actual}")


def apply_options(sock: zmq.Socket[Any], channel: str, options: SocketOptions) -> None:
    """Set every effective option of ``channel`` on ``sock``; call before bind.

    ``sock`` must be a fresh socket of the channel's type (ROUTER, or XPUB for
    iopub) that is neither bound nor connected: options set later do not reach
    connections accepted after bind. Logs :meth:`SocketOptions.describe` and
    the sources at debug level on ``trikernel.sockopts``.

    Raises ``ValueError`` for an unknown channel or wrong socket type and
    ``RuntimeError`` for a socket already bound/connected (both local bugs);
    :class:`ConfigError` if libzmq refuses a value trikernel accepted (the
    caller must then close the socket and stop start-up).
    """
    _check_socket(sock, channel)
    if sock.getsockopt(zmq.LAST_ENDPOINT):
        raise RuntimeError(
            f"apply_options({channel!r}) after bind/connect: libzmq copies options at bind, "
            "so they would not reach later connections"
        )
    for name, value in options.for_channel(channel):
        try:
            sock.setsockopt(zmq.SocketOption[name], value)
        except zmq.ZMQError as e:
            raise ConfigError(
                f"socket option {format_spec(channel, name, value)} "
                f"({options.source_of(channel, name)}): libzmq refused it: {e}"
            ) from e
    log.debug("%s", options.describe(channel))
    if log.isEnabledFor(logging.DEBUG):
        origin = " ".join(f"{n}<-{options.source_of(channel, n)}" for n, _ in options.for_channel(channel))
        log.debug("socket option sources for %s: %s", channel, origin)


def read_back(sock: zmq.Socket[Any], channel: str, options: SocketOptions) -> dict[str, OptionValue]:
    """Read the effective options of ``channel`` back from ``sock`` with getsockopt.

    Returns ``{NAME: value}`` for every effective option libzmq can read;
    write-only options (``readable=False`` in :data:`CATALOGUE`:
    ROUTER_HANDOVER, XPUB_NODROP, XPUB_VERBOSE) are left out. For tests and
    diagnostics. Raises ``ValueError`` like :func:`apply_options`.
    """
    _check_socket(sock, channel)
    out: dict[str, OptionValue] = {}
    for name, _ in options.for_channel(channel):
        if CATALOGUE[name].readable:
            out[name] = sock.getsockopt(zmq.SocketOption[name])
    return out
