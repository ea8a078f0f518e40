"""ZeroMQ socket options: what trikernel accepts, precedence, validation, apply.

One job: turn the socket options an operator gives (command line,
environment variable, TOML config file) plus trikernel's defaults into one
validated set of effective options per channel, and set it on a fresh
socket *before* it is bound. Why before bind: libzmq copies a socket's
options into the listener at ``bind()``, so an HWM changed later never
reaches a subscriber that connects later (zmq_setsockopt(3) does not say
so; pyzmq's ``Socket.set_hwm`` warns about it). :func:`apply_options`
refuses a socket that is already bound or connected.

Looked up, not kept: an option's name, number, aliases (``IDENTITY`` is
``ROUTING_ID``) and C type (int, int64, bytes) come from pyzmq's
:class:`zmq.SocketOption`. Kept, because pyzmq does not know them:
:data:`CATALOGUE` (unit, accepted values, socket types, readability of each
accepted option), :data:`REJECTED` (why the others are refused) and
:data:`DEFAULTS` (with reasons). Channels and socket types come from
:mod:`trikernel.channels`. docs/socket-options.md describes every option;
tests/test_sockopts.py checks its tables against this module.

Precedence (docs/socket-options.md): 1. source first: ``--socket-option``
> ``TRIKERNEL_SOCKET_OPTIONS`` > config file ``[socket_options]`` >
defaults; 2. within one source, a channel entry beats a ``*`` entry,
whatever their order; 3. then the last entry wins. :func:`resolve`
validates every entry of every source before anything is applied and raises
:class:`~trikernel.errors.ConfigError` (one line naming the option, the
channel, the source and what is allowed) at the first bad one.

Threads: all pure except :func:`apply_options` and :func:`read_back`, which
belong to the thread that owns the socket (start-up: the main thread, before
the io thread starts). :class:`SocketOptions` is immutable and shareable.

Runs on: any thread for the pure parts (:func:`resolve`,
:class:`SocketOptions`); :func:`apply_options` and :func:`read_back` on
the socket's owner: the main thread, at start-up, before bind.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import re
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Final

import zmq

from trikernel.errors import ConfigError
from trikernel.protocol.channels import CHANNELS, SOCKET_TYPE_NAMES
from trikernel.server.sockets import SOCKET_TYPES
from trikernel.server.subscribers import IOPUB_MIN_MAXMSGSIZE, SUBSCRIBE_OVERHEAD, iopub_maxmsgsize

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "ALL_CHANNELS",
    "BOOLEAN",
    "CATALOGUE",
    "CHANNELS",
    "CHANNEL_SOCKET_TYPES",
    "CONFIG_TABLE",
    "DEFAULTS",
    "ENV_VAR",
    "REJECTED",
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

#: An effective option value: ``int`` for integer options, ``bytes`` for
#: string options (what ``zmq.Socket.setsockopt`` takes).
OptionValue = int | bytes

#: The channel wildcard: the option is set on all five channels.
ALL_CHANNELS: Final = "*"
#: pyzmq socket type of each channel (``{"shell": zmq.ROUTER, ...}``; sockets.py).
CHANNEL_SOCKET_TYPES: Final[Mapping[str, int]] = SOCKET_TYPES
#: Environment variable holding specs separated by whitespace or ``;``.
ENV_VAR: Final = "TRIKERNEL_SOCKET_OPTIONS"
#: Name of the TOML table read from the ``--config`` file.
CONFIG_TABLE: Final = "socket_options"
#: :attr:`OptionSpec.unit` of a 0/1 switch: also takes true/false, on/off, yes/no.
BOOLEAN: Final = "boolean"

_TYPE_OF: Final[dict[str, str]] = {c: t for c, t in SOCKET_TYPE_NAMES.items()}
_ANY_TYPE: Final = frozenset(SOCKET_TYPE_NAMES.values())
_ROUTER, _XPUB = frozenset({"ROUTER"}), frozenset({"XPUB"})
_C_MAX: Final = {"int": 2**31 - 1, "int64": 2**63 - 1}  # largest value of pyzmq's _OptType
_WORDS: Final = {"true": 1, "on": 1, "yes": 1, "false": 0, "off": 0, "no": 0}


def _either(values: Iterable[int]) -> str:
    """``(-1, 0, 1)`` -> ``"-1, 0 or 1"``."""
    *head, last = (str(v) for v in values)
    return f"{', '.join(head)} or {last}" if head else last


@dataclass(frozen=True)
class OptionSpec:
    """What trikernel knows about one accepted libzmq option and pyzmq does not.

    ``name``: libzmq's name without ``ZMQ_``, a :class:`zmq.SocketOption`
    member (which gives its number and C type, :attr:`kind`). ``unit``: of
    the value (``"milliseconds"``, ``"seconds"``, ``"bytes"``...), or
    :data:`BOOLEAN`. ``minimum``/``maximum``: inclusive bounds (for a bytes
    option: of its length in bytes); ``maximum=None`` is the largest value
    of the C type. ``also``: accepted values below ``minimum``. ``choices``:
    if set, the only accepted values. ``step``: the value must be a multiple
    of it. ``note``: what special values mean. ``socket_types``: libzmq
    socket type names that accept it (``"ROUTER"``, ``"XPUB"``).
    ``readable``: libzmq can getsockopt it. Source: zmq_setsockopt(3),
    zmq_getsockopt(3), libzmq 4.3.
    """

    name: str
    unit: str
    minimum: int = 0
    maximum: int | None = None
    _: KW_ONLY
    also: tuple[int, ...] = ()
    choices: tuple[int, ...] | None = None
    step: int = 1
    note: str = ""
    socket_types: frozenset[str] = _ANY_TYPE
    readable: bool = True

    @property
    def kind(self) -> str:
        """pyzmq's C type of the option, ``"int"``, ``"int64"`` or ``"bytes"`` (``SocketOption._opt_type``)."""
        return str(zmq.SocketOption[self.name]._opt_type.value)

    @property
    def values(self) -> tuple[int, ...] | None:
        """The only accepted values, if limited: :attr:`choices`, or ``(0, 1)`` for a :data:`BOOLEAN`."""
        return (0, 1) if self.choices is None and self.unit == BOOLEAN else self.choices

    @property
    def allowed(self) -> str:
        """What the option takes, for errors and docs: ``"an integer >= 0 (messages; 0 = no limit)"``."""
        if self.kind == "bytes":
            return f"a {self.unit} of {self.minimum} to {self.maximum} bytes, without whitespace or /"
        if self.values is not None:
            text = _either(self.values)
        else:
            what = "an integer" if self.step == 1 else f"a multiple of {self.step}"
            bounds = f">= {self.minimum}" if self.maximum is None else f"from {self.minimum} to {self.maximum}"
            if self.also:  # the note says what the extra values mean
                return f"{_either(self.also)} ({self.note}) or {what} {bounds} ({self.unit})"
            text = f"{what} {bounds}"
        detail = "; ".join(p for p in ("" if self.unit == BOOLEAN else self.unit, self.note) if p)
        return f"{text} ({detail})" if detail else text

    def accepts(self, value: OptionValue) -> bool:
        """True if ``value`` (``bytes`` for a bytes option, else ``int``) is allowed."""
        if isinstance(value, bytes) or self.kind == "bytes":
            if not isinstance(value, bytes) or self.maximum is None:
                return False
            return self.minimum <= len(value) <= self.maximum and not any(c in value for c in b" \t\r\n\0/")
        if self.values is not None:
            return value in self.values
        upper = _C_MAX[self.kind] if self.maximum is None else self.maximum
        return value in self.also or (self.minimum <= value <= upper and value % self.step == 0)

    def applies_to(self, channel: str) -> bool:
        """True if the option applies to ``channel`` (``*``: to all five)."""
        return self.channels() == CHANNELS if channel == ALL_CHANNELS else channel in self.channels()

    def channels(self) -> tuple[str, ...]:
        """The channels this option applies to, in :data:`CHANNELS` order."""
        return tuple(c for c in CHANNELS if _TYPE_OF[c] in self.socket_types)


_MS = "milliseconds"
_OS = "OS default"
_WELCOME = "the kernel needs every subscription to send iopub_welcome"
#: Every option trikernel accepts, ``{canonical NAME: OptionSpec}``: the
#: allow-list (everything else is refused, see :data:`REJECTED`). Values and
#: units from zmq_setsockopt(3); only options this pyzmq knows are listed, and
#: libzmq itself refuses one it lacks at :func:`apply_options`.
CATALOGUE: Final[Mapping[str, OptionSpec]] = {
    s.name: s
    for s in (
        OptionSpec("SNDHWM", "messages", note="0 = no limit"),
        OptionSpec("RCVHWM", "messages", note="0 = no limit"),
        OptionSpec("LINGER", _MS, -1, note="-1 = wait forever, 0 = discard"),
        OptionSpec("SNDTIMEO", _MS, -1, note="-1 = block forever"),
        OptionSpec("RCVTIMEO", _MS, -1, note="-1 = block forever"),
        OptionSpec("MAXMSGSIZE", "bytes", -1, note="-1 = no limit"),
        OptionSpec("SNDBUF", "bytes", -1, note="-1 or 0 = OS default"),
        OptionSpec("RCVBUF", "bytes", -1, note="-1 or 0 = OS default"),
        OptionSpec("TCP_KEEPALIVE", "", choices=(-1, 0, 1), note="-1 = OS default"),
        # libzmq takes 0 for these three; the OS then refuses it at accept time.
        OptionSpec("TCP_KEEPALIVE_IDLE", "seconds", 1, also=(-1,), note=_OS),
        OptionSpec("TCP_KEEPALIVE_INTVL", "seconds", 1, also=(-1,), note=_OS),
        OptionSpec("TCP_KEEPALIVE_CNT", "probes", 1, also=(-1,), note=_OS),
        OptionSpec("TCP_MAXRT", _MS, note="0 = OS default"),
        OptionSpec("BACKLOG", "connections"),
        OptionSpec("HANDSHAKE_IVL", _MS, note="0 = no limit"),
        OptionSpec("HEARTBEAT_IVL", _MS, note="0 = off"),
        # libzmq keeps deciseconds in 16 bits: it truncates other values and refuses more than 6553599.
        OptionSpec("HEARTBEAT_TTL", _MS, 0, 6_553_500, step=100),
        OptionSpec("HEARTBEAT_TIMEOUT", _MS),
        OptionSpec("TOS", "IP TOS byte", 0, 255),  # libzmq takes any int >= 0
        OptionSpec("IMMEDIATE", BOOLEAN),
        OptionSpec("IPV6", BOOLEAN),
        OptionSpec("BINDTODEVICE", "network interface name", 1, 15),  # IFNAMSIZ is 16 with the NUL
        OptionSpec("ROUTER_HANDOVER", BOOLEAN, socket_types=_ROUTER, readable=False),
        OptionSpec("XPUB_NODROP", BOOLEAN, socket_types=_XPUB, readable=False),
        OptionSpec("XPUB_VERBOSE", BOOLEAN, choices=(1,), note=_WELCOME, socket_types=_XPUB, readable=False),
    )
    if s.name in zmq.SocketOption.__members__
}

#: Defaults per channel, ``{channel: {NAME: value}}``, with the reason for each
#: (docs/socket-options.md, "Defaults and why"):
#: - LINGER=1000 ms everywhere: shutdown flushes pending replies/outputs for up
#:   to 1 s but never hangs on a peer that stopped reading (libzmq: -1).
#: - ROUTER_HANDOVER=0 on ROUTER channels (libzmq's default; ipykernel sets 1
#:   on shell, control and stdin): jupyter_client's DEALERs use
#:   ``session.bsession`` as identity, so every client one KernelManager makes
#:   shares it, and ``stop_channels()`` on a client whose shell channel never
#:   started connects one for a moment. With handover on, such a connection
#:   takes the live client's route over and what was on the old connection is
#:   lost (tests/test_kernel.py lost an execute_request that way, 1 run in 4).
#:   Off, a second connection of a live identity waits, unread, until the first
#:   one is gone; nothing is lost.
#: - HEARTBEAT_IVL=10000 ms, HEARTBEAT_TIMEOUT=60000 ms on shell, control,
#:   stdin and iopub: ZMTP pings find a peer that is gone without closing its
#:   connection (a network drop, a frozen client) within a minute, not TCP
#:   keepalive's two hours; its reconnection (same identity) is then served, and
#:   a dead subscriber stops holding IOPub memory (libzmq#2892, the cause of
#:   ipykernel#270). A live peer's libzmq answers pings itself, reading or not.
#: - iopub SNDHWM=10000: finite, so a stalled subscriber costs bounded memory;
#:   10x libzmq's 1000 so ordinary output bursts fit without stalling.
#: - iopub XPUB_NODROP=1: a full subscriber makes the send wait (the iopub
#:   task's timeout fallback then drops for that one message), no silent loss.
#: - iopub XPUB_VERBOSE=1: every subscriber gets iopub_welcome (JEP 65).
#: - iopub MAXMSGSIZE: a subscription longer than --max-topic-bytes costs its
#:   connection before libzmq stores it (subscribers.iopub_maxmsgsize; 1034 for
#:   the default 1024 bytes, computed from the kernel's --max-topic-bytes by :func:`resolve`).
_PINGS: Final[Mapping[str, OptionValue]] = {"HEARTBEAT_IVL": 10_000, "HEARTBEAT_TIMEOUT": 60_000}
DEFAULTS: Final[Mapping[str, Mapping[str, OptionValue]]] = {
    **{c: {"LINGER": 1000, "ROUTER_HANDOVER": 0, **_PINGS} for c in ("shell", "control", "stdin")},
    "hb": {"LINGER": 1000, "ROUTER_HANDOVER": 0},
    "iopub": {"LINGER": 1000, "MAXMSGSIZE": 1034, "SNDHWM": 10000, "XPUB_NODROP": 1, "XPUB_VERBOSE": 1, **_PINGS},
}

_RESERVED = "is reserved: the kernel sets security options itself (CurveZMQ keys from the connection file)"
_ROUTING_ID = "is not configurable: the kernel's own routing id plays no role for its clients"
_AFFINITY = "is not configurable: I/O-thread affinity is a context setting of the kernel"
_CONNECT_ONLY = "applies only to connecting sockets; trikernel binds every channel"
_SEMANTICS = "would change message semantics the kernel relies on"
_UNUSED = "concerns a transport, socket type or feature trikernel does not use"
#: Why an option pyzmq knows is refused: ``((reason, (fnmatch pattern, ...)), ...)``
#: over canonical names, first match wins; any other option not in
#: :data:`CATALOGUE` "is not supported by trikernel".
REJECTED: Final[tuple[tuple[str, tuple[str, ...]], ...]] = tuple(
    (reason, tuple(patterns.split()))
    for reason, patterns in (
        ("is never allowed: subscriptions belong to the clients, not to the kernel", "SUBSCRIBE UNSUBSCRIBE"),
        (_RESERVED, "CURVE_* PLAIN_* ZAP_* GSSAPI_*"),
        (_ROUTING_ID, "ROUTING_ID"),
        (_AFFINITY, "AFFINITY"),
        ("is a deprecated alias; give SNDHWM and RCVHWM", "HWM"),
        ("is read-only", "TYPE RCVMORE EVENTS FD LAST_ENDPOINT MECHANISM THREAD_SAFE TOPICS_COUNT"),
        (_CONNECT_ONLY, "RECONNECT_* CONNECT_TIMEOUT CONNECT_ROUTING_ID PROBE_ROUTER SOCKS_*"),
        (_SEMANTICS, "ROUTER_MANDATORY ROUTER_RAW ROUTER_NOTIFY CONFLATE XPUB_MANUAL XPUB_MANUAL_LAST_VALUE"),
        (_SEMANTICS, "XPUB_WELCOME_MSG XPUB_VERBOSER ONLY_FIRST_SUBSCRIBE HELLO_MSG DISCONNECT_MSG HICCUP_MSG"),
        (_SEMANTICS, "METADATA USE_FD"),
        (_UNUSED, "RATE RECOVERY_IVL MULTICAST_* VMCI_* NORM_* WSS_* IPC_FILTER_* TCP_ACCEPT_FILTER IPV4ONLY"),
        (_UNUSED, "REQ_* STREAM_* XSUB_* INVERT_MATCHING"),
    )
)


def _rejection_reason(name: str) -> str:
    matches = (r for r, patterns in REJECTED if any(fnmatch.fnmatchcase(name, p) for p in patterns))
    return next(matches, "is not supported by trikernel")


# --------------------------------------------------------------------------- parsing


#: One validated setting: ``(channel or "*", canonical NAME, value)``.
Setting = tuple[str, str, OptionValue]
_SPEC_RE = re.compile(r"^\s*(?P<channel>[^.=\s]+)\.(?P<name>[^=\s]+)\s*=(?P<value>.*)$")


def _fail(channel: str, name: str, raw: object, source: str, problem: str) -> ConfigError:
    shown = f"{channel}.{name}" + ("" if raw is None else f"={raw}")
    return ConfigError(f"socket option {shown} ({source}): {problem}")


def _lookup(channel: str, raw_name: str, raw_value: object, source: str) -> tuple[str, OptionSpec]:
    """Return ``(channel, spec)`` for a raw channel and option name, or raise ConfigError."""
    chan = channel.strip().lower()
    if chan != ALL_CHANNELS and chan not in _TYPE_OF:
        problem = f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)} or * (all five)"
        raise _fail(channel, raw_name, raw_value, source, problem)
    name = raw_name.strip().upper().removeprefix("ZMQ_")
    supported = ", ".join(sorted(n for n, s in CATALOGUE.items() if s.applies_to(chan)))
    member = zmq.SocketOption.__members__.get(name)
    if member is None:
        import difflib  # only on the error path

        close = difflib.get_close_matches(name, list(CATALOGUE), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problem = f"unknown ZeroMQ socket option {name}{hint}; supported on {chan}: {supported}"
        raise _fail(chan, name, raw_value, source, problem)
    spec = CATALOGUE.get(member.name)  # the canonical name: IDENTITY -> ROUTING_ID
    if spec is None:
        alias = f" ({member.name})" if member.name != name else ""
        problem = f"{name}{alias} {_rejection_reason(member.name)}; supported on {chan}: {supported}"
        raise _fail(chan, name, raw_value, source, problem)
    if not spec.applies_to(chan):
        where = " and ".join(
            f"{t} channels ({', '.join(c for c in CHANNELS if _TYPE_OF[c] == t)})" for t in sorted(spec.socket_types)
        )
        problem = f"{spec.name} applies only to {where}, not to "
        if chan == ALL_CHANNELS:
            problem += f"all five channels (*); give it per channel, e.g. {spec.channels()[0]}.{spec.name}=..."
        else:
            problem += f"{chan} (a {_TYPE_OF[chan]} socket)"
        raise _fail(chan, name, raw_value, source, problem)
    return chan, spec


def _convert(spec: OptionSpec, raw: object) -> OptionValue | None:
    """Convert a CLI/env string or a TOML value to the option's type; None if it is not one."""
    if spec.kind == "bytes":
        return raw.strip().encode("utf-8") if isinstance(raw, str) else None
    if isinstance(raw, bool):  # TOML true/false: only for a 0/1 switch
        return int(raw) if spec.unit == BOOLEAN else None
    if isinstance(raw, int):
        return raw
    if not isinstance(raw, str):
        return None
    word = raw.strip().lower()
    if spec.unit == BOOLEAN and word in _WORDS:
        return _WORDS[word]
    try:
        return int(word, 10)
    except ValueError:
        return None


def _setting(channel: str, raw_name: str, raw_value: object, source: str) -> Setting:
    chan, spec = _lookup(channel, raw_name, raw_value, source)
    value = _convert(spec, raw_value)
    if value is None or not spec.accepts(value):
        problem = f"bad value {raw_value!r}; {spec.name} takes {spec.allowed}"
        raise _fail(chan, spec.name, raw_value, source, problem)
    return chan, spec.name, value


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
    return _setting(match["channel"], match["name"], match["value"], source)


def format_spec(channel: str, name: str, value: OptionValue) -> str:
    """Inverse of :func:`parse_spec`: ``("iopub", "SNDHWM", 10000)`` -> ``"iopub.SNDHWM=10000"``."""
    text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return f"{channel}.{name}={text}"


def _from_config(path: str) -> tuple[str, list[Setting]]:
    """``(source label, settings)`` of the ``[socket_options]`` table of the TOML file at ``path``."""
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
    for other in sorted(k for k in data if k != CONFIG_TABLE):
        # other tables are left to other readers; a near miss is a typo that
        # would otherwise drop every option in silence
        if difflib.get_close_matches(other, [CONFIG_TABLE], n=1, cutoff=0.8):
            raise ConfigError(f"{label}: unknown table [{other}]: did you mean [{CONFIG_TABLE}]?")
    table = data.get(CONFIG_TABLE, {})
    if not isinstance(table, dict):
        kind = type(table).__name__
        raise ConfigError(f'{label}: [{CONFIG_TABLE}] must be a table of "CHANNEL.NAME" = value, got {kind}')
    source = f"{label} [{CONFIG_TABLE}]"
    out: list[Setting] = []
    for key, value in table.items():
        if isinstance(value, dict):  # [socket_options.iopub] SNDHWM = 1, or iopub.SNDHWM = 1 (dotted key)
            for name, inner in value.items():
                if isinstance(inner, dict):
                    raise _fail(key, name, None, source, 'nested too deep; use "CHANNEL.NAME" = value')
                out.append(_setting(key, name, inner, source))
        elif "." in key:
            channel, name = key.split(".", 1)
            out.append(_setting(channel, name, value, source))
        else:
            example = '"iopub.SNDHWM" = 10000'
            raise ConfigError(f'{source}: bad key {key!r}; expected "CHANNEL.NAME" = value, e.g. {example}')
    return source, out


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
        return dict(self.effective)[channel]

    def source_of(self, channel: str, name: str) -> str:
        """Label of the source that set ``name`` on ``channel``; KeyError if unset."""
        return dict(dict(self.sources)[channel])[name]

    def describe(self, channel: str) -> str:
        """The debug line: ``"effective socket options for iopub: LINGER=1000 ..."``."""
        items = " ".join(format_spec(channel, n, v).split(".", 1)[1] for n, v in self.for_channel(channel))
        return f"effective socket options for {channel}: {items}"

    def non_default(self) -> list[tuple[str, str, OptionValue]]:
        """``(channel, NAME, value)`` for every value an operator set that differs from :data:`DEFAULTS`
        (a default computed at start-up, iopub MAXMSGSIZE from ``--max-topic-bytes``, is none)."""
        return [
            (c, n, v)
            for c, pairs in self.effective
            for n, v in pairs
            if DEFAULTS[c].get(n) != v and self.source_of(c, n) != "default"
        ]

    def as_argv(self) -> list[str]:
        """``["--socket-option", SPEC, ...]`` reproducing every non-default value.

        Meant for baking into a kernelspec's argv at install time: it holds
        the result of all sources (CLI, environment, config file), so the
        installed kernel needs neither the variable nor the file. A value
        equal on all five channels is written once as ``*.NAME=VALUE``.
        Round trip: parsing the specs back with :func:`resolve` gives the same
        ``effective``. Order: wildcard specs first (by name), then by channel
        (CHANNELS order) and name.
        """
        nd = self.non_default()
        by_name: dict[str, dict[str, OptionValue]] = {}
        for chan, name, value in nd:
            by_name.setdefault(name, {})[chan] = value
        wild = {n for n, vals in by_name.items() if set(vals) == set(CHANNELS) and len(set(vals.values())) == 1}
        specs = [format_spec(ALL_CHANNELS, n, by_name[n][CHANNELS[0]]) for n in sorted(wild)]
        specs += [format_spec(c, n, v) for c, n, v in nd if n not in wild]
        return [arg for spec in specs for arg in ("--socket-option", spec)]


def _merge(layers: Iterable[tuple[str, Sequence[Setting]]]) -> SocketOptions:
    """Merge ``(source label, settings)`` layers, weakest first."""
    eff: dict[str, dict[str, OptionValue]] = {c: {} for c in CHANNELS}
    src: dict[str, dict[str, str]] = {c: {} for c in CHANNELS}
    for source, settings in layers:
        # "*" first so that a channel entry of the same source beats it; the
        # sort is stable, so among equals the last entry wins.
        for chan, name, value in sorted(settings, key=lambda s: s[0] != ALL_CHANNELS):
            for c in CHANNELS if chan == ALL_CHANNELS else (chan,):
                eff[c][name] = value
                src[c][name] = source
    return SocketOptions(
        effective=tuple((c, tuple(sorted(eff[c].items()))) for c in CHANNELS),
        sources=tuple((c, tuple(sorted(src[c].items()))) for c in CHANNELS),
    )


def resolve(
    cli_specs: Sequence[str] | None,
    environ: Mapping[str, str],
    config_path: str | None,
    *,
    max_topic_bytes: int | None = None,
) -> SocketOptions:
    """Validate every source and merge them into the effective options.

    ``cli_specs``: the ``--socket-option`` values, e.g. ``["iopub.SNDHWM=20000"]``
    (None is taken as empty). ``environ``: usually ``os.environ``; only
    :data:`ENV_VAR` is read (specs separated by whitespace or ``;``).
    ``config_path``: a TOML file whose ``[socket_options]`` table maps
    ``"CHANNEL.NAME"`` to a value (or ``[socket_options.CHANNEL]`` tables);
    other tables in the file are ignored here.

    ``max_topic_bytes``: the kernel's ``--max-topic-bytes``; the default
    ``iopub.MAXMSGSIZE`` is then :func:`iopub_maxmsgsize` of it, and an
    operator's own value is checked against it (:func:`_check_iopub_maxmsgsize`).
    None (``install``): :data:`DEFAULTS` as they are.

    Precedence: CLI > environment > config file > :data:`DEFAULTS`; within one
    source a channel entry beats ``*``; then the last entry wins. An HWM of 0
    (no limit) is logged as a warning on ``trikernel.sockopts``, and so is an
    iopub MAXMSGSIZE above the default.

    Raises :class:`ConfigError` (one line) for a missing/unreadable/invalid
    file or any bad entry, or an iopub MAXMSGSIZE below the default; nothing
    is applied anywhere by this function.

    Runs on: any thread (pure but for the warnings it logs).
    """
    defaults: list[Setting] = [(c, n, v) for c in CHANNELS for n, v in DEFAULTS[c].items()]
    if max_topic_bytes is not None:
        bound = iopub_maxmsgsize(max_topic_bytes)
        defaults = [(c, n, bound if (c, n) == ("iopub", "MAXMSGSIZE") else v) for c, n, v in defaults]
    layers = [("default", defaults)]
    if config_path is not None:
        layers.append(_from_config(config_path))
    env_specs = [s for s in re.split(r"[\s;]+", environ.get(ENV_VAR, "")) if s]
    layers.append((ENV_VAR, [parse_spec(s, source=ENV_VAR) for s in env_specs]))
    layers.append(("--socket-option", [parse_spec(s) for s in cli_specs or ()]))
    options = _merge(layers)
    for chan, pairs in options.effective:
        for name, value in pairs:
            if name in ("SNDHWM", "RCVHWM") and value == 0:
                source = options.source_of(chan, name)
                log.warning(
                    "socket option %s.%s=0 (%s) removes the high-water mark: memory is unbounded", chan, name, source
                )
    if max_topic_bytes is not None:
        _check_iopub_maxmsgsize(options, max_topic_bytes)
    return options


def _check_iopub_maxmsgsize(options: SocketOptions, max_topic_bytes: int) -> None:
    """An operator's iopub MAXMSGSIZE: below :func:`iopub_maxmsgsize` a subscriber whose topic the
    kernel would welcome loses its connection (ConfigError); above it (or -1, no limit) longer
    subscriptions reach libzmq's topic tree again (a warning naming the cost)."""
    value = dict(options.for_channel("iopub"))["MAXMSGSIZE"]
    source = options.source_of("iopub", "MAXMSGSIZE")
    bound = iopub_maxmsgsize(max_topic_bytes)
    if source == "default" or value == bound:
        return
    assert isinstance(value, int)
    if 0 <= value < bound:
        raise _fail(
            "iopub",
            "MAXMSGSIZE",
            value,
            source,
            f"below {bound}, what a subscription of --max-topic-bytes {max_topic_bytes} takes on the wire "
            f"(topic + {SUBSCRIBE_OVERHEAD} bytes, at least {IOPUB_MIN_MAXMSGSIZE}): its subscriber would lose "
            "its connection; give -1 or at least that, or set a channel of its own (shell.MAXMSGSIZE=...)",
        )
    limit = "no limit" if value < 0 else f"{value} bytes"
    log.warning(
        "socket option iopub.MAXMSGSIZE=%s (%s): subscriptions up to %s reach libzmq's topic tree, about 48 bytes "
        "of memory per topic byte and io-thread time whenever a subscriber leaves; the default is %d "
        "(docs/iopub.md, 'Subscriptions')",
        value,
        source,
        limit,
        bound,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--socket-option SPEC`` (repeatable) and ``--config PATH`` to ``parser``.

    Results land in ``args.socket_options`` (list of str, default empty) and
    ``args.config`` (str or None); pass them to :func:`resolve`.
    """
    spec_help = (
        "set a ZeroMQ socket option before bind, e.g. iopub.SNDHWM=10000 or *.TCP_KEEPALIVE=1; CHANNEL is "
        f"{', '.join(CHANNELS)} or *; repeatable; beats ${ENV_VAR} and --config (see docs/socket-options.md)"
    )
    config_help = f'TOML config file; its [{CONFIG_TABLE}] table maps "CHANNEL.NAME" to a value'
    parser.add_argument(
        "--socket-option",
        dest="socket_options",
        action="append",
        default=[],
        help=spec_help,
        metavar="CHANNEL.NAME=VALUE",
    )
    parser.add_argument("--config", dest="config", default=None, metavar="PATH", help=config_help)


# --------------------------------------------------------------------------- sockets


def _check_socket(sock: zmq.Socket[Any], channel: str) -> None:
    if channel not in _TYPE_OF:
        raise ValueError(f"unknown channel {channel!r}; expected one of {CHANNELS}")
    actual = int(sock.getsockopt(zmq.TYPE))
    if actual != CHANNEL_SOCKET_TYPES[channel]:
        raise ValueError(f"{channel} needs a {_TYPE_OF[channel]} socket, got socket type {actual}")


def apply_options(sock: zmq.Socket[Any], channel: str, options: SocketOptions) -> None:
    """Set every effective option of ``channel`` on ``sock``; call before bind.

    ``sock`` must be a fresh socket of the channel's type (ROUTER, or XPUB for
    iopub) that is neither bound nor connected: options set later do not reach
    connections accepted after bind. Logs :meth:`SocketOptions.describe` and
    the sources at debug level on ``trikernel.sockopts``. Call from the thread
    that owns ``sock``.

    Raises ``ValueError`` for an unknown channel or wrong socket type and
    ``RuntimeError`` for a socket already bound/connected (both local bugs);
    :class:`ConfigError` if libzmq refuses a value trikernel accepted, or an
    option this libzmq lacks (zmq_setsockopt(3): EINVAL); the caller must
    then close the socket and stop start-up.
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
            spec = format_spec(channel, name, value)
            raise ConfigError(
                f"socket option {spec} ({options.source_of(channel, name)}): libzmq refused it: {e}"
            ) from e
    log.debug("%s", options.describe(channel))
    if log.isEnabledFor(logging.DEBUG):
        origin = " ".join(f"{n}<-{options.source_of(channel, n)}" for n, _ in options.for_channel(channel))
        log.debug("socket option sources for %s: %s", channel, origin)


def read_back(sock: zmq.Socket[Any], channel: str, options: SocketOptions) -> dict[str, OptionValue]:
    """Read the effective options of ``channel`` back from ``sock`` with getsockopt.

    Returns ``{NAME: value}`` (``int``, or ``bytes`` for a bytes option) for
    every effective option libzmq can read; write-only options
    (``readable=False`` in :data:`CATALOGUE`: ROUTER_HANDOVER, XPUB_NODROP,
    XPUB_VERBOSE) are left out. For tests and diagnostics; call from the
    thread that owns ``sock``. Raises ``ValueError`` like :func:`apply_options`.
    """
    _check_socket(sock, channel)
    return {n: sock.getsockopt(zmq.SocketOption[n]) for n, _ in options.for_channel(channel) if CATALOGUE[n].readable}
