"""Tests for trikernel.sockopts: parsing, precedence, rejections, argv, sockets.

Pure tests first (no sockets), then real zmq sockets on 127.0.0.1: options
applied before bind are read back with getsockopt, write-only options are
checked by behaviour, and the IOPub HWM reaches a subscriber that connects
after bind (and an HWM set after bind does not).
"""

from __future__ import annotations

import argparse
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq

from trikernel.errors import ConfigError
from trikernel.protocol.channels import SOCKET_TYPE_NAMES
from trikernel.server import sockopts
from trikernel.server.sockopts import (
    BOOLEAN,
    CATALOGUE,
    CHANNEL_SOCKET_TYPES,
    CHANNELS,
    DEFAULTS,
    ENV_VAR,
    REJECTED,
    SocketOptions,
    add_arguments,
    apply_options,
    parse_spec,
    read_back,
    resolve,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

LOOPBACK = "tcp://127.0.0.1"


def opts(*cli: str, env: str | None = None, config: str | None = None) -> SocketOptions:
    environ = {} if env is None else {ENV_VAR: env}
    return resolve(list(cli), environ, config)


def eff(o: SocketOptions, channel: str) -> dict[str, int | bytes]:
    return dict(o.for_channel(channel))


def write_toml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "trikernel.toml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def specs_from_argv(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return list(parser.parse_args(argv).socket_options)


# --------------------------------------------------------------------------- defaults


def test_defaults_match_documented_table() -> None:
    o = opts()
    for chan in CHANNELS:
        assert eff(o, chan) == dict(DEFAULTS[chan])
    pings = {"HEARTBEAT_IVL": 10_000, "HEARTBEAT_TIMEOUT": 60_000}
    assert eff(o, "iopub") == {
        "LINGER": 1000, "MAXMSGSIZE": 1034, "SNDHWM": 10000, "XPUB_NODROP": 1, "XPUB_VERBOSE": 1, **pings
    }  # fmt: skip
    for chan in ("shell", "control", "stdin"):
        assert eff(o, chan) == {"LINGER": 1000, "ROUTER_HANDOVER": 0, **pings}
    assert eff(o, "hb") == {"LINGER": 1000, "ROUTER_HANDOVER": 0}
    assert o.as_argv() == []
    assert o.source_of("iopub", "SNDHWM") == "default"


def test_for_channel_is_sorted_and_stable() -> None:
    o = opts("iopub.TOS=8", "iopub.BACKLOG=5")
    names = [n for n, _ in o.for_channel("iopub")]
    assert names == sorted(names)
    assert o.for_channel("iopub") == opts("iopub.BACKLOG=5", "iopub.TOS=8").for_channel("iopub")
    with pytest.raises(KeyError):
        o.for_channel("*")


def test_socket_options_is_frozen_and_hashable() -> None:
    o = opts()
    with pytest.raises(AttributeError):
        o.effective = ()  # type: ignore[misc]
    assert hash(o) == hash(opts())


def test_describe_line_format() -> None:
    o = opts("iopub.SNDHWM=20000")
    assert o.describe("iopub") == (
        "effective socket options for iopub: HEARTBEAT_IVL=10000 HEARTBEAT_TIMEOUT=60000 LINGER=1000 "
        "MAXMSGSIZE=1034 SNDHWM=20000 XPUB_NODROP=1 XPUB_VERBOSE=1"
    )


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("iopub.SNDHWM=10000", ("iopub", "SNDHWM", 10000)),
        ("iopub.sndhwm=10000", ("iopub", "SNDHWM", 10000)),
        ("IOPUB.SndHwm=10_000", ("iopub", "SNDHWM", 10000)),
        ("iopub.ZMQ_SNDHWM=7", ("iopub", "SNDHWM", 7)),
        (" shell.LINGER = -1 ", ("shell", "LINGER", -1)),
        ("*.TCP_KEEPALIVE=1", ("*", "TCP_KEEPALIVE", 1)),
        ("*.tcp_keepalive=-1", ("*", "TCP_KEEPALIVE", -1)),
        ("shell.ROUTER_HANDOVER=true", ("shell", "ROUTER_HANDOVER", 1)),
        ("shell.ROUTER_HANDOVER=Off", ("shell", "ROUTER_HANDOVER", 0)),
        ("iopub.XPUB_NODROP=0", ("iopub", "XPUB_NODROP", 0)),
        ("hb.MAXMSGSIZE=9223372036854775807", ("hb", "MAXMSGSIZE", 2**63 - 1)),
        ("*.BINDTODEVICE=lo", ("*", "BINDTODEVICE", b"lo")),
    ],
)
def test_parse_spec_accepts(spec: str, expected: tuple[str, str, int | bytes]) -> None:
    assert parse_spec(spec) == expected


#: A valid and an invalid value for every catalogue option (boundaries).
VALUES: dict[str, tuple[list[str], list[str]]] = {
    "SNDHWM": (["0", "1", "2147483647"], ["-1", "2147483648", "1.5", "x", ""]),
    "RCVHWM": (["0", "1000"], ["-1", "abc"]),
    "LINGER": (["-1", "0", "1000"], ["-2"]),
    "SNDTIMEO": (["-1", "0", "5"], ["-2"]),
    "RCVTIMEO": (["-1", "0", "5"], ["-2"]),
    "MAXMSGSIZE": (["-1", "0", "1048576"], ["-2", "9223372036854775808"]),
    "SNDBUF": (["-1", "0", "65536"], ["-2"]),
    "RCVBUF": (["-1", "0", "65536"], ["-2"]),
    "TCP_KEEPALIVE": (["-1", "0", "1"], ["2", "-2", "true"]),
    "TCP_KEEPALIVE_IDLE": (["-1", "1", "300"], ["0", "-2"]),
    "TCP_KEEPALIVE_INTVL": (["-1", "1", "60"], ["0", "-2"]),
    "TCP_KEEPALIVE_CNT": (["-1", "1", "9"], ["0", "-2"]),
    "TCP_MAXRT": (["0", "30000"], ["-1"]),
    "BACKLOG": (["0", "100"], ["-1"]),
    "HANDSHAKE_IVL": (["0", "30000"], ["-1"]),
    "HEARTBEAT_IVL": (["0", "1000"], ["-1"]),
    "HEARTBEAT_TTL": (["0", "100", "6553500"], ["150", "6553600", "-100"]),
    "HEARTBEAT_TIMEOUT": (["0", "3000"], ["-1"]),
    "TOS": (["0", "255"], ["256", "-1"]),
    "IMMEDIATE": (["0", "1", "true", "false"], ["2", "-1", "maybe"]),
    "IPV6": (["0", "1"], ["2"]),
    "BINDTODEVICE": (["lo", "eth0", "a" * 15], ["", "a" * 16, "a/b"]),
    "ROUTER_HANDOVER": (["0", "1", "yes", "no"], ["2"]),
    "XPUB_NODROP": (["0", "1"], ["2", "-1"]),
    "XPUB_VERBOSE": (["1", "true"], ["0", "2"]),
}


def test_values_table_covers_catalogue() -> None:
    assert set(VALUES) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_option_value_range(name: str) -> None:
    spec = CATALOGUE[name]
    chan = spec.channels()[0]
    good, bad = VALUES[name]
    for value in good:
        assert parse_spec(f"{chan}.{name}={value}")[1] == name
    for value in bad:
        with pytest.raises(ConfigError) as exc:
            parse_spec(f"{chan}.{name}={value}")
        msg = str(exc.value)
        assert f"{chan}.{name}={value}" in msg
        assert "bad value" in msg
        assert spec.allowed in msg
        assert "\n" not in msg


# --------------------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        # syntax
        ("SNDHWM=1", ["bad socket option 'SNDHWM=1'", "CHANNEL.NAME=VALUE"]),
        ("iopub.SNDHWM", ["bad socket option", "CHANNEL.NAME=VALUE"]),
        ("iopub=SNDHWM=1", ["bad socket option", "CHANNEL.NAME=VALUE"]),
        ("", ["bad socket option"]),
        # unknown channel
        ("shel.SNDHWM=1", ["shel.SNDHWM=1", "unknown channel 'shel'", "shell, iopub, stdin, control, hb or *"]),
        ("heartbeat.LINGER=1", ["unknown channel 'heartbeat'"]),
        # unknown option, with a suggestion and the allowed list
        (
            "iopub.SNDHMW=5",
            [
                "iopub.SNDHMW=5",
                "unknown ZeroMQ socket option SNDHMW",
                "did you mean SNDHWM?",
                "supported on iopub:",
                "XPUB_NODROP",
            ],
        ),
        ("shell.NOPE=1", ["unknown ZeroMQ socket option NOPE", "supported on shell:", "ROUTER_HANDOVER"]),
        # wrong socket type
        (
            "shell.XPUB_NODROP=1",
            ["shell.XPUB_NODROP=1", "applies only to XPUB channels (iopub)", "not to shell (a ROUTER socket)"],
        ),
        ("control.XPUB_VERBOSE=1", ["applies only to XPUB channels (iopub)", "not to control"]),
        ("hb.XPUB_NODROP=0", ["not to hb (a ROUTER socket)"]),
        (
            "iopub.ROUTER_HANDOVER=1",
            ["applies only to ROUTER channels (shell, stdin, control, hb)", "not to iopub (a XPUB socket)"],
        ),
        ("*.XPUB_NODROP=0", ["*.XPUB_NODROP=0", "not to all five channels (*)", "iopub.XPUB_NODROP="]),
        ("*.ROUTER_HANDOVER=0", ["not to all five channels (*)", "shell.ROUTER_HANDOVER="]),
        # never / reserved / not applicable
        ("iopub.SUBSCRIBE=x", ["iopub.SUBSCRIBE=x", "SUBSCRIBE is never allowed"]),
        ("iopub.UNSUBSCRIBE=", ["UNSUBSCRIBE is never allowed"]),
        ("shell.CURVE_SERVER=1", ["CURVE_SERVER is reserved", "connection file"]),
        ("*.CURVE_SECRETKEY=abc", ["CURVE_SECRETKEY is reserved"]),
        ("shell.PLAIN_SERVER=1", ["PLAIN_SERVER is reserved"]),
        ("shell.ZAP_DOMAIN=x", ["ZAP_DOMAIN is reserved"]),
        ("shell.GSSAPI_SERVER=1", ["GSSAPI_SERVER is reserved"]),
        ("shell.IDENTITY=abc", ["IDENTITY (ROUTING_ID) is not configurable"]),
        ("shell.ROUTING_ID=abc", ["ROUTING_ID is not configurable"]),
        ("*.AFFINITY=1", ["AFFINITY is not configurable"]),
        ("shell.ROUTER_MANDATORY=1", ["ROUTER_MANDATORY would change message semantics"]),
        ("iopub.XPUB_VERBOSER=1", ["XPUB_VERBOSER would change message semantics"]),
        ("iopub.XPUB_WELCOME_MSG=hi", ["XPUB_WELCOME_MSG would change message semantics"]),
        ("iopub.CONFLATE=1", ["CONFLATE would change message semantics"]),
        ("shell.RECONNECT_IVL=5", ["RECONNECT_IVL applies only to connecting sockets"]),
        ("shell.PROBE_ROUTER=1", ["PROBE_ROUTER applies only to connecting sockets"]),
        ("shell.TYPE=1", ["TYPE is read-only"]),
        ("shell.LAST_ENDPOINT=x", ["LAST_ENDPOINT is read-only"]),
        ("iopub.RATE=100", ["RATE concerns a transport"]),
        ("*.HWM=5", ["HWM is a deprecated alias; give SNDHWM and RCVHWM"]),
        # bad values
        ("iopub.SNDHWM=-5", ["iopub.SNDHWM=-5", "bad value '-5'", "SNDHWM takes an integer >= 0"]),
        ("iopub.XPUB_VERBOSE=0", ["XPUB_VERBOSE takes 1"]),
        ("*.TCP_KEEPALIVE=yes", ["TCP_KEEPALIVE takes -1, 0 or 1"]),
    ],
)
def test_rejections_are_one_clear_line(spec: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve([spec], {}, None)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "(--socket-option)" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize(
    "name", sorted(n for n in zmq.SocketOption.__members__ if zmq.SocketOption[n].name not in CATALOGUE)
)
def test_every_other_pyzmq_option_is_rejected(name: str) -> None:
    for chan in ("shell", "iopub"):
        with pytest.raises(ConfigError) as exc:
            parse_spec(f"{chan}.{name}=1")
        msg = str(exc.value)
        assert name in msg
        assert f"supported on {chan}:" in msg


def test_one_bad_spec_rejects_the_whole_set() -> None:
    with pytest.raises(ConfigError, match=r"iopub\.SNDHWM=-1"):
        resolve(["iopub.SNDHWM=5", "shell.LINGER=0", "iopub.SNDHWM=-1"], {}, None)


def test_bad_env_names_the_variable() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve([], {ENV_VAR: "iopub.SNDHWM=1 shell.XPUB_NODROP=1"}, None)
    assert f"({ENV_VAR})" in str(exc.value)
    assert "shell.XPUB_NODROP=1" in str(exc.value)


def test_env_is_validated_even_when_cli_overrides_it() -> None:
    with pytest.raises(ConfigError, match=ENV_VAR):
        resolve(["iopub.SNDHWM=5"], {ENV_VAR: "iopub.SNDHWM=-5"}, None)


# --------------------------------------------------------------------------- config file


def test_config_flat_keys(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        '[socket_options]\n"iopub.SNDHWM" = 20000\n"*.TCP_KEEPALIVE" = 1\n'
        '"shell.ROUTER_HANDOVER" = false\n"iopub.XPUB_NODROP" = "0"\n"*.BINDTODEVICE" = "lo"\n',
    )
    o = opts(config=path)
    assert eff(o, "iopub")["SNDHWM"] == 20000
    assert eff(o, "iopub")["XPUB_NODROP"] == 0
    assert eff(o, "shell")["ROUTER_HANDOVER"] == 0
    assert all(eff(o, c)["TCP_KEEPALIVE"] == 1 for c in CHANNELS)
    assert eff(o, "hb")["BINDTODEVICE"] == b"lo"
    assert o.source_of("iopub", "SNDHWM") == f"config file {path} [socket_options]"


def test_config_nested_and_dotted_keys(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        "[other]\nanything = 'ignored here'\n"
        "[socket_options]\niopub.SNDHWM = 123\n"
        '"*".LINGER = 50\n'
        "[socket_options.shell]\nlinger = 7\n",
    )
    o = opts(config=path)
    assert eff(o, "iopub")["SNDHWM"] == 123
    assert eff(o, "shell")["LINGER"] == 7
    assert eff(o, "control")["LINGER"] == 50


def test_config_without_table_is_fine(tmp_path: Path) -> None:
    assert opts(config=write_toml(tmp_path, "[other]\nx = 1\n")) == opts()


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[socket_options\n", ["invalid TOML"]),
        ("socket_options = 5\n", ["[socket_options] must be a table"]),
        ("[socket_options]\nSNDHWM = 5\n", ["bad key 'SNDHWM'", '"CHANNEL.NAME" = value']),
        ('[socket_options]\n"iopub.SNDHWM" = 1.5\n', ["iopub.SNDHWM=1.5", "bad value 1.5"]),
        ('[socket_options]\n"iopub.SNDHWM" = true\n', ["iopub.SNDHWM=True", "bad value True"]),
        ('[socket_options]\n"iopub.SNDHWM" = -3\n', ["iopub.SNDHWM=-3", "SNDHWM takes"]),
        ('[socket_options]\n"shell.XPUB_NODROP" = 1\n', ["shell.XPUB_NODROP=1", "applies only to XPUB"]),
        ('[socket_options]\n"iopub.BOGUS" = 1\n', ["unknown ZeroMQ socket option BOGUS"]),
        ('[socket_options]\n"iopub.BINDTODEVICE" = 3\n', ["iopub.BINDTODEVICE=3", "bad value 3"]),
        ("[socket_options.iopub.deep]\nx = 1\n", ["nested too deep"]),
        ('[socket_option]\n"iopub.SNDHWM" = 1\n', ["unknown table [socket_option]", "did you mean [socket_options]"]),
        ('[socketoptions]\n"iopub.SNDHWM" = 1\n', ["unknown table [socketoptions]"]),
    ],
)
def test_config_rejections_name_the_file(tmp_path: Path, text: str, needles: list[str]) -> None:
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        opts(config=path)
    msg = str(exc.value)
    assert f"config file {path}" in msg
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_config_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml: not found"):
        opts(config=missing)


def test_config_unreadable_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        opts(config=str(tmp_path))  # a directory


# --------------------------------------------------------------------------- precedence


def test_source_precedence_cli_env_file_default(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        '[socket_options]\n"iopub.SNDHWM" = 1\n"iopub.RCVHWM" = 1\n"iopub.TOS" = 1\n',
    )
    o = opts("iopub.SNDHWM=3", env="iopub.SNDHWM=2 iopub.RCVHWM=2", config=path)
    assert eff(o, "iopub")["SNDHWM"] == 3
    assert eff(o, "iopub")["RCVHWM"] == 2
    assert eff(o, "iopub")["TOS"] == 1
    assert eff(o, "iopub")["LINGER"] == 1000
    assert o.source_of("iopub", "SNDHWM") == "--socket-option"
    assert o.source_of("iopub", "RCVHWM") == ENV_VAR
    assert o.source_of("iopub", "LINGER") == "default"


def test_wildcard_from_stronger_source_beats_channel_from_weaker() -> None:
    o = opts("*.LINGER=0", env="shell.LINGER=5")
    assert {eff(o, c)["LINGER"] for c in CHANNELS} == {0}


def test_wildcard_beats_defaults() -> None:
    o = opts("*.LINGER=0")
    assert {eff(o, c)["LINGER"] for c in CHANNELS} == {0}


@pytest.mark.parametrize("order", [("*.LINGER=0", "shell.LINGER=5"), ("shell.LINGER=5", "*.LINGER=0")])
def test_channel_beats_wildcard_within_a_source(order: tuple[str, str]) -> None:
    o = opts(*order)
    assert eff(o, "shell")["LINGER"] == 5
    assert all(eff(o, c)["LINGER"] == 0 for c in CHANNELS if c != "shell")


def test_channel_beats_wildcard_within_env_and_file(tmp_path: Path) -> None:
    o = opts(env="shell.LINGER=5;*.LINGER=0")
    assert eff(o, "shell")["LINGER"] == 5
    assert eff(o, "hb")["LINGER"] == 0
    path = write_toml(tmp_path, '[socket_options]\n"shell.LINGER" = 5\n"*.LINGER" = 0\n')
    o = opts(config=path)
    assert eff(o, "shell")["LINGER"] == 5
    assert eff(o, "hb")["LINGER"] == 0


def test_last_wins_within_a_source() -> None:
    assert eff(opts("iopub.SNDHWM=1", "iopub.SNDHWM=2"), "iopub")["SNDHWM"] == 2
    assert eff(opts(env="iopub.SNDHWM=1;iopub.SNDHWM=2"), "iopub")["SNDHWM"] == 2


@pytest.mark.parametrize("sep", [" ", ";", "\n", " ; ", "\t;;"])
def test_env_separators(sep: str) -> None:
    o = opts(env=f"{sep}iopub.SNDHWM=5{sep}shell.LINGER=0{sep}")
    assert eff(o, "iopub")["SNDHWM"] == 5
    assert eff(o, "shell")["LINGER"] == 0


def test_empty_env_is_defaults() -> None:
    assert opts(env="  ; ") == opts()
    assert resolve(None, {"OTHER": "x"}, None) == opts()


# --------------------------------------------------------------------------- iopub MAXMSGSIZE (issue 26.1)


def test_iopub_maxmsgsize_default_follows_max_topic_bytes() -> None:
    o = resolve([], {}, None, max_topic_bytes=4096)
    assert eff(o, "iopub")["MAXMSGSIZE"] == 4106
    assert o.source_of("iopub", "MAXMSGSIZE") == "default"
    assert o.as_argv() == []  # computed at start-up, never baked into a kernelspec
    assert eff(resolve([], {}, None, max_topic_bytes=0), "iopub")["MAXMSGSIZE"] == 1024
    assert "MAXMSGSIZE" not in eff(o, "shell")


def test_iopub_maxmsgsize_below_the_bound_is_one_line_error() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve(["iopub.MAXMSGSIZE=500"], {}, None, max_topic_bytes=1024)
    text = str(exc.value)
    assert text.startswith("socket option iopub.MAXMSGSIZE=500 (--socket-option): below 1034")
    assert "\n" not in text
    with pytest.raises(ConfigError, match=r"iopub\.MAXMSGSIZE=2000 .*below 4106"):  # a * entry reaches iopub too
        resolve([], {ENV_VAR: "*.MAXMSGSIZE=2000"}, None, max_topic_bytes=4096)


@pytest.mark.parametrize("spec", ["iopub.MAXMSGSIZE=-1", "*.MAXMSGSIZE=1000000"])
def test_iopub_maxmsgsize_above_the_bound_is_taken_with_a_warning(spec: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="trikernel.sockopts"):
        o = resolve([spec], {}, None, max_topic_bytes=1024)
    assert eff(o, "iopub")["MAXMSGSIZE"] == int(spec.split("=")[1])
    (line,) = [r.getMessage() for r in caplog.records if "MAXMSGSIZE" in r.getMessage()]
    assert "reach libzmq's topic tree" in line
    assert "the default is 1034" in line


def test_iopub_maxmsgsize_at_the_bound_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="trikernel.sockopts"):
        o = resolve(["iopub.MAXMSGSIZE=1034"], {}, None, max_topic_bytes=1024)
    assert eff(o, "iopub")["MAXMSGSIZE"] == 1034
    assert not caplog.records


def test_zero_hwm_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="trikernel.sockopts"):
        opts("iopub.SNDHWM=0")
    assert any("iopub.SNDHWM=0" in r.getMessage() and "unbounded" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- argv


def test_add_arguments_repeatable_and_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--socket-option", "iopub.SNDHWM=1", "--socket-option=*.LINGER=0", "--config", "x.toml"])
    assert args.socket_options == ["iopub.SNDHWM=1", "*.LINGER=0"]
    assert args.config == "x.toml"
    args = parser.parse_args([])
    assert args.socket_options == []
    assert args.config is None


@pytest.mark.parametrize(
    "cli",
    [
        [],
        ["iopub.SNDHWM=20000"],
        ["*.TCP_KEEPALIVE=1", "iopub.XPUB_NODROP=0", "shell.ROUTER_HANDOVER=0"],
        ["*.LINGER=0", "shell.LINGER=5", "hb.BINDTODEVICE=lo"],
        ["*.LINGER=1000", "iopub.SNDHWM=10000"],  # equal to defaults: nothing to bake
        ["*.SNDBUF=65536", "*.HEARTBEAT_TTL=6553500", "*.MAXMSGSIZE=9223372036854775807"],
    ],
)
def test_as_argv_round_trip(cli: list[str]) -> None:
    o = opts(*cli)
    argv = o.as_argv()
    assert argv[::2] == ["--socket-option"] * (len(argv) // 2)
    again = resolve(specs_from_argv(argv), {}, None)
    assert again.effective == o.effective
    assert again.as_argv() == argv


def test_as_argv_bakes_all_sources_and_collapses_wildcards(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[socket_options]\n"*.TCP_KEEPALIVE" = 1\n')
    o = opts("iopub.SNDHWM=20000", env="shell.LINGER=0", config=path)
    assert o.as_argv() == [
        "--socket-option",
        "*.TCP_KEEPALIVE=1",
        "--socket-option",
        "shell.LINGER=0",
        "--socket-option",
        "iopub.SNDHWM=20000",
    ]
    assert opts().as_argv() == []


# --------------------------------------------------------------------------- real sockets


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    # libzmq's own defaults here (conftest gives the test process LINGER 0);
    # these sockets are closed with linger 0 by destroy()
    c.sockopts.pop(zmq.LINGER, None)
    try:
        yield c
    finally:
        c.destroy(linger=0)


#: Non-default values for every readable catalogue option (BINDTODEVICE
#: separately: binding through it needs CAP_NET_RAW).
READABLE_SPECS = [
    "SNDHWM=1234",
    "RCVHWM=2345",
    "LINGER=250",
    "SNDTIMEO=3000",
    "RCVTIMEO=4000",
    "MAXMSGSIZE=1048576",
    "SNDBUF=131072",
    "RCVBUF=262144",
    "TCP_KEEPALIVE=1",
    "TCP_KEEPALIVE_IDLE=120",
    "TCP_KEEPALIVE_INTVL=15",
    "TCP_KEEPALIVE_CNT=4",
    "TCP_MAXRT=20000",
    "BACKLOG=50",
    "HANDSHAKE_IVL=5000",
    "HEARTBEAT_IVL=2000",
    "HEARTBEAT_TTL=6000",
    "HEARTBEAT_TIMEOUT=7000",
    "TOS=16",
    "IMMEDIATE=1",
    "IPV6=1",
]


def test_readable_specs_cover_readable_catalogue() -> None:
    names = {s.split("=")[0] for s in READABLE_SPECS}
    assert names == {n for n, s in CATALOGUE.items() if s.readable} - {"BINDTODEVICE"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("channel", CHANNELS)
def test_options_in_effect_on_bound_socket(ctx: zmq.Context[zmq.Socket[bytes]], channel: str) -> None:
    o = opts(*(f"{channel}.{s}" for s in READABLE_SPECS))
    sock = ctx.socket(CHANNEL_SOCKET_TYPES[channel])
    apply_options(sock, channel, o)
    sock.bind_to_random_port(LOOPBACK)
    got = read_back(sock, channel, o)
    expected = {n: v for n, v in o.for_channel(channel) if CATALOGUE[n].readable}
    assert got == expected
    assert got["SNDHWM"] == 1234
    assert got["LINGER"] == 250
    assert not set(got) & {"ROUTER_HANDOVER", "XPUB_NODROP", "XPUB_VERBOSE"}  # write-only


@pytest.mark.timeout(30)
@pytest.mark.parametrize("channel", CHANNELS)
def test_defaults_in_effect_on_bound_socket(ctx: zmq.Context[zmq.Socket[bytes]], channel: str) -> None:
    o = opts()
    sock = ctx.socket(CHANNEL_SOCKET_TYPES[channel])
    apply_options(sock, channel, o)
    sock.bind_to_random_port(LOOPBACK)
    got = read_back(sock, channel, o)
    assert got["LINGER"] == 1000
    if channel == "iopub":
        assert got == {
            "HEARTBEAT_IVL": 10000, "HEARTBEAT_TIMEOUT": 60000, "LINGER": 1000, "MAXMSGSIZE": 1034, "SNDHWM": 10000
        }  # fmt: skip
    elif channel != "hb":
        assert (got["HEARTBEAT_IVL"], got["HEARTBEAT_TIMEOUT"]) == (10000, 60000)


def test_bindtodevice_is_set_as_bytes(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    o = opts("*.BINDTODEVICE=lo")
    sock = ctx.socket(zmq.ROUTER)
    apply_options(sock, "shell", o)  # no bind: SO_BINDTODEVICE needs CAP_NET_RAW
    assert read_back(sock, "shell", o)["BINDTODEVICE"] == b"lo"


def test_apply_logs_effective_line(ctx: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture) -> None:
    o = opts("iopub.SNDHWM=777")
    with caplog.at_level("DEBUG", logger="trikernel.sockopts"):
        apply_options(ctx.socket(zmq.XPUB), "iopub", o)
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "effective socket options for iopub: HEARTBEAT_IVL=10000 HEARTBEAT_TIMEOUT=60000 LINGER=1000 "
        "MAXMSGSIZE=1034 SNDHWM=777 XPUB_NODROP=1 XPUB_VERBOSE=1" in lines
    )
    assert any("SNDHWM<---socket-option" in line for line in lines)


def test_apply_refuses_bound_socket(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    sock = ctx.socket(zmq.ROUTER)
    sock.bind_to_random_port(LOOPBACK)
    with pytest.raises(RuntimeError, match="after bind"):
        apply_options(sock, "shell", opts())


def test_apply_refuses_wrong_socket_type_or_channel(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    with pytest.raises(ValueError, match="iopub needs a XPUB socket"):
        apply_options(ctx.socket(zmq.ROUTER), "iopub", opts())
    with pytest.raises(ValueError, match="shell needs a ROUTER socket"):
        apply_options(ctx.socket(zmq.XPUB), "shell", opts())
    with pytest.raises(ValueError, match="unknown channel"):
        apply_options(ctx.socket(zmq.ROUTER), "*", opts())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("handover", [1, 0])
def test_router_handover_by_behaviour(ctx: zmq.Context[zmq.Socket[bytes]], handover: int) -> None:
    """ROUTER_HANDOVER is write-only: check what it does (libzmq zmq_setsockopt)."""
    o = opts(f"shell.ROUTER_HANDOVER={handover}")
    router = ctx.socket(zmq.ROUTER)
    apply_options(router, "shell", o)
    url = f"{LOOPBACK}:{router.bind_to_random_port(LOOPBACK)}"
    first, second = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for d in (first, second):
        d.setsockopt(zmq.ROUTING_ID, b"same-client")
        d.setsockopt(zmq.LINGER, 0)
    first.connect(url)
    first.send(b"from-first")
    assert router.poll(5000)
    assert router.recv_multipart() == [b"same-client", b"from-first"]
    second.connect(url)
    second.send(b"from-second")
    if handover:
        assert router.poll(5000)
        assert router.recv_multipart() == [b"same-client", b"from-second"]
        router.send_multipart([b"same-client", b"reply"])
        assert second.poll(5000)
        assert second.recv() == b"reply"
    else:
        # Without handover the second connection is refused: its message never arrives.
        assert router.poll(500) == 0


@pytest.mark.timeout(30)
def test_xpub_verbose_default_passes_every_subscription(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """XPUB_VERBOSE=1 (write-only): each subscriber's subscribe reaches the kernel."""
    xpub = ctx.socket(zmq.XPUB)
    apply_options(xpub, "iopub", opts())
    url = f"{LOOPBACK}:{xpub.bind_to_random_port(LOOPBACK)}"
    seen, subs = [], []  # keep the SUBs alive: a collected SUB unsubscribes
    for _ in range(3):
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(url)
        subs.append(sub)
        assert xpub.poll(5000)
        seen.append(xpub.recv())
    assert seen == [b"\x01"] * 3


# --------------------------------------------------------------------------- HWM before bind

BURST = 2000
PAYLOAD = 16 * 1024
SUB_RCVHWM = 10
SUB_RCVBUF = 64 * 1024


def _tcp_wmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 * 1024 * 1024


def stalled_subscriber_count(
    ctx: zmq.Context[zmq.Socket[bytes]], o: SocketOptions, *, set_after_bind: str | None = None
) -> int:
    """Bind iopub with ``o``, connect a SUB, burst BURST messages, count what it gets.

    The SUB connects after bind and reads nothing until the burst is over.
    ``set_after_bind``: an option spec set with setsockopt after bind instead.
    """
    xpub = ctx.socket(zmq.XPUB)
    apply_options(xpub, "iopub", o)
    url = f"{LOOPBACK}:{xpub.bind_to_random_port(LOOPBACK)}"
    if set_after_bind is not None:
        _, name, value = parse_spec(set_after_bind)
        xpub.setsockopt(zmq.SocketOption[name], value)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, SUB_RCVHWM)
    sub.setsockopt(zmq.RCVBUF, SUB_RCVBUF)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(url)
    assert xpub.poll(5000), "subscription never arrived"
    assert xpub.recv() == b"\x01"
    payload = b"x" * PAYLOAD
    for _ in range(BURST):
        xpub.send(payload, zmq.NOBLOCK)  # NODROP=0: never EAGAIN, drops at the HWM
    received = 0
    while sub.poll(1000):  # drain until quiet: 1 s without a message
        sub.recv()
        received += 1
        if received == BURST:
            break
    return received


def _upper_bound(hwm: int) -> int:
    # HWM of the XPUB pipe + the SUB's own queue + what fits in the TCP send
    # and receive buffers (messages of PAYLOAD bytes) + libzmq batching slack.
    tcp = (_tcp_wmem_max() + 2 * SUB_RCVBUF) // PAYLOAD
    return hwm + SUB_RCVHWM + tcp + 50


@pytest.mark.timeout(60)
def test_small_hwm_set_before_bind_reaches_late_subscriber(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    n = 100
    got = stalled_subscriber_count(ctx, opts(f"iopub.SNDHWM={n}", "iopub.XPUB_NODROP=0"))
    assert 0 < got <= _upper_bound(n)
    assert _upper_bound(n) < BURST  # the bound is meaningful


@pytest.mark.timeout(60)
def test_large_hwm_set_before_bind_delivers_everything(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    got = stalled_subscriber_count(ctx, opts(f"iopub.SNDHWM={BURST + 1000}", "iopub.XPUB_NODROP=0"))
    assert got == BURST


@pytest.mark.timeout(60)
def test_hwm_set_after_bind_does_not_reach_late_subscriber(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """The libzmq fact behind 'options before bind': the bind-time HWM wins."""
    bind_time_hwm = 1000
    o = opts(f"iopub.SNDHWM={bind_time_hwm}", "iopub.XPUB_NODROP=0")
    got = stalled_subscriber_count(ctx, o, set_after_bind="iopub.SNDHWM=20")
    assert got > _upper_bound(20)  # the later setsockopt did not take
    assert got <= _upper_bound(bind_time_hwm)


@pytest.mark.timeout(30)
def test_heartbeat_proxy_echoes_with_options(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """hb: a ROUTER with options applied still echoes through zmq.proxy in C."""
    o = opts("hb.SNDTIMEO=100", "hb.RCVTIMEO=100", "hb.TCP_KEEPALIVE=1")
    hb_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = hb_ctx.socket(zmq.ROUTER)
    apply_options(router, "hb", o)
    url = f"{LOOPBACK}:{router.bind_to_random_port(LOOPBACK)}"

    def echo() -> None:
        try:
            zmq.proxy(router, router)
        except zmq.ContextTerminated:
            pass
        finally:
            router.close(linger=0)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    try:
        req = ctx.socket(zmq.REQ)
        req.connect(url)
        for i in range(3):
            time_msg = f"ping {i}".encode()
            req.send(time_msg)
            assert req.poll(5000)
            assert req.recv() == time_msg
        req.close(linger=0)
    finally:
        hb_ctx.term()
        thread.join(5)
    assert not thread.is_alive()


def test_module_docstring_and_logger() -> None:
    assert sockopts.__doc__
    assert "before bind" in sockopts.__doc__
    assert sockopts.log.name == "trikernel.sockopts"


# --------------------------------------------------------------------------- docs

DOC = Path(__file__).resolve().parents[1] / "docs" / "socket-options.md"


def test_doc_lists_every_supported_option_and_default() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in CATALOGUE:
        assert f"| `{name}` |" in text, name
    for chan in CHANNELS:
        for name in DEFAULTS[chan]:
            assert f"`{name}`" in text.split("## Defaults and why", 1)[1], name


def test_doc_config_example_parses(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    o = opts(config=write_toml(tmp_path, example))
    assert eff(o, "iopub")["SNDHWM"] == 50000
    assert eff(o, "iopub")["XPUB_NODROP"] == 1
    assert eff(o, "shell")["LINGER"] == 0
    assert {eff(o, c)["TCP_KEEPALIVE"] for c in CHANNELS} == {1}


def test_doc_error_examples_are_real() -> None:
    text = DOC.read_text(encoding="utf-8")
    for spec, source_env in [("shell.XPUB_NODROP=1", False), ("iopub.SNDHWM=-5", True), ("shel.SNDHWM=1", False)]:
        cli, environ = ([], {ENV_VAR: spec}) if source_env else ([spec], {})
        with pytest.raises(ConfigError) as exc:
            resolve(cli, environ, None)
        assert f"trikernel: {exc.value}" in text, str(exc.value)


# --------------------------------------------------------------------------- pyzmq is the source of types


def test_option_types_come_from_pyzmq() -> None:
    """Name, number and C type are pyzmq's (``SocketOption._opt_type``); bounds follow the C type."""
    assert set(CATALOGUE) <= set(zmq.SocketOption.__members__)
    kinds = {n: s.kind for n, s in CATALOGUE.items()}
    assert kinds["MAXMSGSIZE"] == "int64"
    assert kinds["BINDTODEVICE"] == "bytes"
    assert {k for n, k in kinds.items() if n not in ("MAXMSGSIZE", "BINDTODEVICE")} == {"int"}
    assert parse_spec("iopub.SNDHWM=2147483647")[2] == 2**31 - 1  # int: 32 bits
    with pytest.raises(ConfigError, match="bad value"):
        parse_spec("iopub.SNDHWM=2147483648")
    assert parse_spec("shell.DELAY_ATTACH_ON_CONNECT=1")[1] == "IMMEDIATE"  # pyzmq's alias


def test_every_rejected_pattern_matches_a_pyzmq_option() -> None:
    """No stale entry in REJECTED: each pattern names at least one option pyzmq knows."""
    names = [m.name for m in zmq.SocketOption]
    for reason, patterns in REJECTED:
        assert reason
        for pattern in patterns:
            matched = [n for n in names if re.fullmatch(pattern.replace("*", ".*"), n)]
            assert matched, pattern
            assert not set(matched) & set(CATALOGUE), pattern


# --------------------------------------------------------------------------- docs match the code


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _table(title: str) -> list[list[str]]:
    """Body rows (header and separator dropped) of the one markdown table under ``## title``."""
    rows = [line.strip().strip("|").split("|") for line in _section(title).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]


def _channels_cell(channels: Sequence[str]) -> str:
    return "all" if tuple(channels) == CHANNELS else ", ".join(channels)


def _default_cell(name: str) -> str:
    """trikernel's default as the option table shows it: ``"1000"``, ``"iopub 10000"`` or ``"—"``."""
    chans = [c for c in CHANNELS if name in DEFAULTS[c]]
    values = {DEFAULTS[c][name] for c in chans}
    if not chans:
        return "—"
    if tuple(chans) == CATALOGUE[name].channels() and len(values) == 1:
        return str(values.pop())
    return ", ".join(f"{c} {DEFAULTS[c][name]!s}" for c in chans)


def test_doc_channel_table_matches_channels() -> None:
    rows = _table("Channels")
    assert [r[0] for r in rows] == [f"`{c}`" for c in CHANNELS] + ["`*`"]
    assert [r[1] for r in rows[:-1]] == [SOCKET_TYPE_NAMES[c] for c in CHANNELS]


def test_doc_option_table_matches_catalogue() -> None:
    """Name, channels, accepted values (the error text) and trikernel default of every row are the code's."""
    rows = _table("Supported options")
    assert [r[0] for r in rows] == [f"`{n}`" for n in CATALOGUE]
    for row in rows:
        name = row[0].strip("`")
        spec = CATALOGUE[name]
        assert row[1:4] == [_channels_cell(spec.channels()), spec.allowed, _default_cell(name)], name


def test_doc_libzmq_defaults_are_what_libzmq_reads(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """The "libzmq default" column: getsockopt on a fresh socket, for every readable option with a number."""
    checked = 0
    for row in _table("Supported options"):
        name, cell = row[0].strip("`"), row[4]
        spec = CATALOGUE[name]
        if spec.readable and re.fullmatch(r"-?\d+", cell):
            sock = ctx.socket(CHANNEL_SOCKET_TYPES[spec.channels()[0]])
            assert sock.getsockopt(zmq.SocketOption[name]) == int(cell), name
            sock.close(linger=0)
            checked += 1
    assert checked >= 18


def test_doc_defaults_table_matches_defaults() -> None:
    expected = set()
    for name in {n for c in CHANNELS for n in DEFAULTS[c]}:
        by_value: dict[int | bytes, list[str]] = {}
        for chan in CHANNELS:
            if name in DEFAULTS[chan]:
                by_value.setdefault(DEFAULTS[chan][name], []).append(chan)
        unit = CATALOGUE[name].unit
        for value, chans in by_value.items():
            shown = str(value) if unit in ("", BOOLEAN) else f"{value!s} {unit}"
            expected.add((_channels_cell(chans), f"`{name}`", shown))
    assert {(r[0], r[1], r[2]) for r in _table("Defaults and why")} == expected


def test_doc_rejected_list_matches_code() -> None:
    """Each bullet starts with the REJECTED patterns it explains (aliases allowed), all of them once."""
    block = next(b for b in _section("Rejected options").split("\n\n") if b.startswith("- "))
    bullets = re.split(r"\n- ", block.removeprefix("- "))
    named: list[str] = []
    for bullet in bullets:
        head = " ".join(bullet.split()).split(": ", 1)[0]
        for name in re.findall(r"`([A-Z0-9_*]+)`", head):
            member = zmq.SocketOption.__members__.get(name)
            named.append(member.name if member is not None else name)
    patterns = [p for _, ps in REJECTED for p in ps]
    assert sorted(set(named)) == sorted(patterns)
    assert len(set(patterns)) == len(patterns)
